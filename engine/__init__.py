"""sopctl: declarative multi-agent SOP pipelines with MetaGPT semantics.

The package is the pipeline: source (safe YAML) -> schema -> spec -> checks -> graph ->
compiler (an immutable CompiledSop) -> the interpreter (roles, environment, team) with every
model call going through the gateway (llm). Nothing heavy is imported here.
"""

__version__ = "0.1.0"
