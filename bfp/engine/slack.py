"""Slack progress messages: start, each epoch, finish, crash.

The token comes from ``./slackbot.token`` (its first non-empty line; later
lines, a comment for instance, are ignored) or the ``BFP_SLACK_TOKEN``
environment variable. A token file that is not UTF-8 text, a token with a
space, control or non-ASCII character inside it, or one shorter than any real
Slack token (``MIN_TOKEN_LENGTH``), is refused with a ``SlackTokenError``
naming where it came from, never quoting it (a short "token" would also be
masked wherever it stands alone in the log; a token with a newline reached
the HTTP library, whose error message carried it escaped). Slack is best effort: a network or auth failure is logged
(without the token) and training goes on.

Why a background thread: a hanging Slack endpoint cost every epoch the HTTP
timeout. Messages of a training run go into a bounded queue that one daemon
thread posts from; training never waits for it, except at the end of the run
(``close``), and then for at most ``drain_timeout`` seconds in all.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .callbacks import Callback
from .ranks import is_main
from .redact import pattern, redact_text

TOKEN_FILE = "slackbot.token"
TOKEN_ENV = "BFP_SLACK_TOKEN"
# Real tokens (xoxb-<team id>-<bot id>-<24 characters>, xoxp-...) are over 40 characters.
MIN_TOKEN_LENGTH = 24
QUEUE_SIZE = 64  # messages waiting to be posted; more are dropped (and counted as failures)


class SlackTokenError(ValueError):
    """A Slack token that cannot be used; the message says where it came from and why."""


def _check_token(token: str, source: str) -> str:
    bad = next((i for i, ch in enumerate(token) if not (ch.isascii() and ch.isprintable()) or ch.isspace()),
               None)
    if bad is not None:
        kind = "a space" if token[bad] == " " else ("a non-ASCII character" if not token[bad].isascii()
                                                   else "a control character")
        raise SlackTokenError(f"the Slack token from {source} holds {kind} at position {bad + 1}; a Slack "
                              f"token is one word of letters, digits and '-' (xoxb-...). Fix the token, or "
                              f"leave `slackbot` off")
    if len(token) < MIN_TOKEN_LENGTH:
        raise SlackTokenError(f"the Slack token from {source} has {len(token)} characters; a Slack token "
                              f"(xoxb-...) has at least {MIN_TOKEN_LENGTH}. Put the bot token there, or "
                              f"leave `slackbot` off")
    return token


def read_token(path: os.PathLike | str = TOKEN_FILE) -> Optional[str]:
    """The token from ``BFP_SLACK_TOKEN`` or from the first non-empty line of ``path``;
    None when neither has one."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return _check_token(env, f"${TOKEN_ENV}")
    p = Path(path)
    if p.is_file():
        try:
            lines = [line.strip() for line in p.read_text(encoding="utf-8").splitlines()]
            tok = next((line for line in lines if line), "")
        except UnicodeDecodeError as e:
            raise SlackTokenError(f"Slack token file {str(p)!r} is not UTF-8 text (byte {e.start}: "
                                  f"{e.object[e.start:e.start + 1]!r}); it must hold the token only") from None
        return _check_token(tok, repr(str(p))) if tok else None
    return None


_STOP = object()


class SlackNotifier(Callback):
    """Posts to ``channel``; every failure is logged through ``log`` and swallowed.
    In a distributed run only rank 0 posts.

    ``send`` posts now and says whether it worked; the training hooks queue their
    messages for the background thread (``post_later``). ``timeout``: seconds one
    HTTP request may take; ``drain_timeout``: the most ``close`` waits for queued messages.
    """

    name = "slack"

    def __init__(self, token: str, channel: str, *, run_name: str = "", base_url: Optional[str] = None,
                 timeout: float = 5.0, drain_timeout: float = 10.0, log: Callable[[str], None] = print):
        from slack_sdk import WebClient
        kw: dict[str, Any] = {"token": token, "timeout": int(max(1, timeout))}
        if base_url:
            kw["base_url"] = base_url
        self.client = WebClient(**kw)
        self.client.retry_handlers = []  # one try: a slow Slack must not slow training
        self.channel, self.run_name = channel, run_name  # the token lives only in client and _pattern
        self.drain_timeout = drain_timeout
        self._pattern = pattern([token])
        self._log = log
        self.failures = 0
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread: Optional[threading.Thread] = None

    def send(self, text: str) -> bool:
        if not is_main():
            return False
        prefix = f"[{self.run_name}] " if self.run_name else ""
        try:
            self.client.chat_postMessage(channel=self.channel, text=prefix + text)
            return True
        except Exception as e:  # SlackApiError, URLError, timeouts: never stop training
            self.failures += 1
            reason = e.response.get("error", "") if hasattr(e, "response") and hasattr(e.response, "get") \
                else f"{type(e).__name__}: {e}"
            if isinstance(e, (socket.timeout, TimeoutError)):
                reason = "timed out"
            self._log(f"slack: message not sent ({redact_text(str(reason), self._pattern)}); "
                      f"training continues")
            return False

    # ---- the background sender ---------------------------------------------------
    def post_later(self, text: str) -> None:
        """Queue ``text`` for the sender thread (started on first use); never blocks."""
        if not is_main():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bfp-slack", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            self.failures += 1
            self._log(f"slack: {QUEUE_SIZE} messages are waiting to be sent; this one is dropped")

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is _STOP:
                return
            self.send(text)

    def close(self) -> None:
        """Let the sender post what is queued, waiting at most ``drain_timeout`` seconds."""
        if self._thread is None:
            return
        deadline = time.monotonic() + self.drain_timeout
        try:  # behind the queued messages; a full queue of a hung endpoint waits no longer than the bound
            self._queue.put(_STOP, timeout=self.drain_timeout)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._log(f"slack: messages still unsent after {self.drain_timeout:g} s; giving up on them")
        self._thread = None

    # ---- training hooks ----------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        self.post_later(f"started: epoch {trainer.epoch + 1}/{trainer.epochs}, {trainer.describe()}")

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        self.post_later(f"epoch {epoch + 1}/{trainer.epochs}: test acc {metrics['test_acc1']:.2f}% "
                        f"(best {trainer.best_acc:.2f}%), train loss {metrics['train_loss']:.4f}, "
                        f"{metrics['images_per_s']:.0f} img/s")

    def on_train_end(self, trainer) -> None:
        self.post_later(f"finished: best test acc {trainer.best_acc:.2f}%")
        self.close()

    def on_exception(self, trainer, exc: BaseException) -> None:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"crashed: {type(exc).__name__}: {exc}"
        self.post_later(f"{what} in epoch {trainer.epoch + 1}")
        self.close()
