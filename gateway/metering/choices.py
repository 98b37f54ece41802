"""The choices after the first of an `n > 1` chat stream, for metering.

Only the first choice is assembled and recorded as the assistant message
(gateway.providers.openai_chat); the others are generated, billed and, when the upstream
speaks the client's dialect, relayed too. A whole stream's usage counts them all (the
provider's); a cut one is estimated, and that estimate must count what every choice generated,
so their text is kept here, on the way, with where it came among the first choice's events:
a delivered prefix of those events says which of it the client had.

A stream's checkpoints (gateway.pipeline.checkpoints) carry the same counts, so that a turn
closed from one after its process died is metered for every choice too.

Nothing here runs for a request of one choice: the parser hands a choice over only when its
index is not 0, the relay attaches this only when the request asked for more than one, and the
checkpoints look for it only then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.metering.tokens import count_text
from gateway.storage.records import Checkpoint

if TYPE_CHECKING:
    from gateway.stream.attempt_log import AttemptLog


class _Piece(NamedTuple):
    at: int  # the first choice's events received before it
    frame: int  # the number of the frame it came in, as the frames written are counted
    choice: int
    reasoning: bool
    text: str


class OtherChoices:
    """What the choices other than the first generated, as they arrived."""

    __slots__ = ("_counted", "_log", "_relayed", "delivered_frames", "indices", "pieces")

    def __init__(self, log: AttemptLog, relayed: bool) -> None:
        self._log = log
        # Relayed unchanged (the client speaks the upstream's dialect): the client is sent
        # these choices; rendered in another dialect, it never is.
        self._relayed = relayed
        self.pieces: list[_Piece] = []
        # How many of the attempt's frames the client had when it ended (set by the relay
        # with the count it records the turn by); None: known only by the events.
        self.delivered_frames: int | None = None
        # The indices of the other choices the stream has shown, text or not.
        self.indices: set[int] = set()
        # The last `counts`, and what they were made of: a checkpoint's look at a stream that
        # did not move counts nothing again.
        self._counted: tuple[tuple[int, int, int | None], dict[str, int]] | None = None

    @property
    def choices(self) -> int:
        """How many choices the stream has shown: the first, and each other one that sent a
        chunk (a choice cut while it still reasoned out of sight may have sent none, so this
        is a floor until the stream ends)."""
        return 1 + len(self.indices)

    def add(self, choice: dict[str, Any]) -> None:
        """One choice of a chunk, whose index is not 0."""
        index = choice.get("index")
        number = index if type(index) is int else -1
        self.indices.add(number)
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        log, pieces = self._log, self.pieces
        at, frame = log.count, log.frames + 1
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            pieces.append(_Piece(at, frame, number, True, reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            pieces.append(_Piece(at, frame, number, False, content))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            for part in (function.get("name"), function.get("arguments")):
                if isinstance(part, str) and part:
                    pieces.append(_Piece(at, frame, number, False, part))

    def tokens(self, delivered: int | None = None) -> tuple[int, int]:
        """(completion, reasoning) tokens the other choices generated, by tokenizer; with
        `delivered`, of what reached the client with the first choice's first `delivered`
        events: the pieces in the frames it had (`delivered_frames`), or where those are not
        known, the pieces that came before the last of those events (a piece after it may or
        may not have reached the client, and what was delivered is never overstated)."""
        if delivered is not None and not self._relayed:
            return 0, 0
        frames = self.delivered_frames
        texts: dict[tuple[int, bool], list[str]] = {}
        for piece in self.pieces:  # in the order they came
            if delivered is not None and (
                piece.frame > frames if frames is not None else piece.at >= delivered
            ):
                break
            texts.setdefault((piece.choice, piece.reasoning), []).append(piece.text)
        # Each choice's text counted whole: a token may span two pieces.
        completion = reasoning = 0
        for (_, is_reasoning), parts in texts.items():
            tokens = count_text("".join(parts))
            completion += tokens
            if is_reasoning:
                reasoning += tokens
        return completion, reasoning

    def counts(self) -> dict[str, int]:
        """What a checkpoint keeps of them: the tokens they generated (`completion`, of it
        `reasoning`), the tokens of what reached the client (`delivered`, by
        `delivered_frames`, 0 where those are not known), and how many choices there are."""
        key = (len(self.pieces), len(self.indices), self.delivered_frames)
        if self._counted is None or self._counted[0] != key:
            completion, reasoning = self.tokens()
            counts = {
                "completion": completion,
                "reasoning": reasoning,
                # (No piece comes before the first choice's first event: with the frames
                # unknown, none is counted delivered.)
                "delivered": self.tokens(0)[0],
                "choices": self.choices,
            }
            self._counted = (key, counts)
        return self._counted[1]


def with_other_choices(checkpoint: Checkpoint, attempts: Sequence[Any]) -> None:
    """Each attempt of a checkpoint (TurnRecorder.checkpoint, its attempts in the order of
    `attempts`) that streamed several choices, with their `counts` as `others`."""
    for entry, attempt in zip(checkpoint["attempts"], attempts, strict=False):
        if (others := other_choices(attempt.id_from)) is not None:
            entry["others"] = others.counts()


def other_choices(parser: Any) -> OtherChoices | None:
    """An attempt's other choices (its stream parser's), when it asked for several."""
    others = getattr(parser, "others", None)
    return others if isinstance(others, OtherChoices) else None
