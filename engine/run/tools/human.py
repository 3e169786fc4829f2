"""The `human` toolset: RoleZero's ask_human and reply_to_human."""

from __future__ import annotations

from engine.run.actions import RunContext, ask_human, reply_to_human

__all__ = ["Human", "says_stop"]


def says_stop(answer: str) -> bool:
    """A person's answer that ends the role (RoleZero: a reply ending in `stop` or `<stop>`;
    here the whole answer, so "don't stop" does not)."""
    return answer.strip().strip(".!").strip().lower() in ("stop", "<stop>")


class Human:
    """`human.*` for one role; `ask` is journaled by the person's answer itself (its key)."""

    def __init__(self, ctx: RunContext, role_id: str, action_id: str, round_: int) -> None:
        self.ctx, self.role_id, self.action_id, self.round = ctx, role_id, action_id, round_
        self.stopped = False
        """The person answered `stop`: the loop ends and the role takes no more turns."""

    async def do_ask(self, question: str, *, call_key: str) -> str:
        answer = await ask_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round,
                                 key=call_key, prompt=question)
        if says_stop(str(answer)):
            self.stopped = True
            return "the person answered: stop. Your work ends here."
        return f"the person answered: {answer}"

    async def do_reply(self, text: str) -> str:
        reply_to_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round, text=text)
        return "the person has your message; do not repeat it"
