"""Suite-wide setup: no test reaches a real model unless it says so with allow_real_models()."""

pytest_plugins = ["engine.testing"]
