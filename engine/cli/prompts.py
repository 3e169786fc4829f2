"""`sopctl show RUN_DIR --prompts [ACTION]`: every request a run sent and its answer, as text.

Kept apart from `engine.cli.report` (the timeline and the HTML report) because it prints
whole texts, not summaries: the messages exactly as the model received them (secrets
redacted by the journal), each under a header that says who asked, which attempt, and what
the answer cost."""

from __future__ import annotations

from engine.journal.history import Exchange

__all__ = ["format_prompts"]


_RULE = "=" * 78


def format_prompts(exchanges: list[Exchange]) -> str:
    """One block per exchange: a header line, then each message and the answer, labelled."""
    if not exchanges:
        return "no model or person exchanges in this run's journal"
    return "\n\n".join(_block(e) for e in exchanges)


def _block(exchange: Exchange) -> str:
    lines = [_RULE, _header(exchange), _RULE]
    if not exchange.messages:
        lines.append("(the journal did not keep this request's messages: it was written by a "
                     "sopctl older than `show --prompts`)")
    for message in exchange.messages:
        lines += [f"--- {message.get('role', '?')}", str(message.get("content", ""))]
    if exchange.response_format is not None:
        lines.append("--- (the output schema travelled as response_format)")
    lines += [f"--- answer ({_answered_by(exchange)})", exchange.answer]
    return "\n".join(lines)


def _header(exchange: Exchange) -> str:
    who = f"{exchange.role}.{exchange.action}" if exchange.role else exchange.action
    attempt = f"  re-ask {exchange.attempt}" if exchange.attempt else ""
    if exchange.origin == "person":
        return f"round {exchange.round}  {who}{attempt}  asked a person"
    if exchange.origin == "tool":   # journaled so that a resume never runs the command again
        return f"round {exchange.round}  {who}  a tool's result (no model call)"
    return (f"round {exchange.round}  {who}{attempt}  model {exchange.model}  "
            f"tokens {exchange.prompt_tokens}+{exchange.completion_tokens}  "
            f"${exchange.cost_usd:.4f}  {exchange.seconds:.2f}s"
            + ("  (copied by a replay)" if exchange.origin == "replay" else ""))


def _answered_by(exchange: Exchange) -> str:
    if exchange.origin == "tool":
        return "the tool"
    return "the person" if exchange.origin == "person" else f"model {exchange.model}"
