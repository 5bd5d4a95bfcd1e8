"""Chat sessions as the extraction worker sees them, and the LoCoMo replay that produces them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memlab.data.locomo import Conversation
from memlab.memory.entry import UserKey

#: The session-state key holding the extraction cursor (tRPC-Agent-Go's name).
CURSOR_KEY = "memory:last_extract_at"
MESSAGE_ROLES = ("user", "assistant", "tool", "system")


@dataclass(frozen=True)
class Message:
    role: str
    text: str
    timestamp: datetime
    id: str = ""
    """A stable id the extractor may cite (the LoCoMo dia_id); becomes the op's source_ids."""
    speaker: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"Message.role: expected one of {MESSAGE_ROLES}, got {self.role!r}")


@dataclass
class ChatSession:
    """One chat session of a user: its messages, and state that outlives a run (the cursor)."""

    id: str
    key: UserKey | None
    messages: list[Message] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def cursor(self) -> datetime | None:
        v = self.state.get(CURSOR_KEY)
        return datetime.fromisoformat(v) if isinstance(v, str) else v

    @cursor.setter
    def cursor(self, value: datetime | None) -> None:
        self.state[CURSOR_KEY] = value

    def delta(self) -> list[Message]:
        """Messages after the cursor that an extractor may read: user/assistant with text only."""
        cur = self.cursor
        return [
            m for m in self.messages
            if (cur is None or m.timestamp > cur) and m.role in ("user", "assistant") and m.text.strip()
        ]


def locomo_messages(conv: Conversation, user_speaker: str | None = None, session_index: int | None = None
                    ) -> list[Message]:
    """A conversation's turns as messages: ``user_speaker`` (default speaker_a) is "user", the other
    "assistant"; timestamps are the session date plus one second per turn, so order is kept."""
    user = user_speaker or conv.speakers[0]
    if user not in conv.speakers:
        raise ValueError(f"user_speaker: expected one of {conv.speakers}, got {user!r}")
    out = []
    for s in conv.sessions:
        if session_index is not None and s.index != session_index:
            continue
        for i, t in enumerate(s.turns):
            out.append(Message(role="user" if t.speaker == user else "assistant", text=t.searchable_text,
                               timestamp=s.date_time + timedelta(seconds=i), id=t.dia_id, speaker=t.speaker))
    return out


def replay_locomo(conv: Conversation, key: UserKey, user_speaker: str | None = None,
                  session: ChatSession | None = None) -> Iterator[ChatSession]:
    """Append a conversation's sessions in order to one chat session, yielding after each (a "run");
    the caller triggers extraction at each yield, as an agent framework does after a run."""
    chat = session or ChatSession(id=f"locomo:{conv.sample_id}", key=key)
    for s in sorted(conv.sessions, key=lambda s: s.date_time):
        have = {m.id for m in chat.messages}
        chat.messages.extend(m for m in locomo_messages(conv, user_speaker, s.index) if m.id not in have)
        yield chat
