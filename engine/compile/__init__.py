"""A checked file made an immutable CompiledSop: the pipeline's last step before a run."""
