"""`sopctl lsp`: the checker inside an editor, as a Language Server over stdio.

The server (`server.py`, on pygls) publishes exactly the diagnostics `sopctl validate`
finds (`analysis.py` runs the same compiler), and answers completion, hover, definitions,
references, symbols and quick fixes from the file's text (`cursor.py`: where the cursor
is, even in a half-typed file) and an index of its names (`index.py`). It never runs a
model, an exec action or an MCP server: it imports nothing past the compiler (the layer
test keeps it so), so litellm is never loaded.
"""
