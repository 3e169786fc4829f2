"""Many runs of one SOP: `sopctl batch` over a dataset, its evaluation, replay regression.

- `rows`: the dataset read as it goes (JSONL or CSV), one `Row` at a time.
- `results`: `DIR/results.jsonl` (one line per row) and a row's line from its journal.
- `evaluate`: per-row expectations (sandboxed jinja) and SOP conformance to a golden run.
- `runner`: the rows run through `engine.api`, N at a time in one event loop, under one budget.
- `regression`: every journaled run of a folder replayed with its recorded answers.
- `ray_backend`: the rows as Ray tasks (the optional `ray` extra).
"""
