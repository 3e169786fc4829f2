"""MetaGPT's custom Data Interpreter tool (examples/di/custom_tool.py), as a script: called
with arg1 and arg2, it prints one JSON object (the exec action's `output` tree)."""

import json
import sys


def magic_function(arg1: str, arg2: int) -> dict:
    """The tool itself, as MetaGPT registers it with @register_tool."""
    return {"arg1": arg1 * 3, "arg2": arg2 * 5}


if __name__ == "__main__":
    print(json.dumps(magic_function(sys.argv[1], int(sys.argv[2]))))
