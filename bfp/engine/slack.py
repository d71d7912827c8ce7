"""Slack progress messages: start, each epoch, finish, crash.

The token comes from ``./slackbot.token`` or the ``BFP_SLACK_TOKEN``
environment variable. Slack is best effort: a network or auth failure is
logged (without the token) and training goes on.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional

from .callbacks import Callback
from .ranks import is_main

TOKEN_FILE = "slackbot.token"
TOKEN_ENV = "BFP_SLACK_TOKEN"


def read_token(path: os.PathLike | str = TOKEN_FILE) -> Optional[str]:
    """The token from ``BFP_SLACK_TOKEN`` or from ``path``; None when neither has one."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    p = Path(path)
    if p.is_file():
        tok = p.read_text(encoding="utf-8").strip()
        return tok or None
    return None


class SlackNotifier(Callback):
    """Posts to ``channel``; every failure is logged through ``log`` and swallowed.
    In a distributed run only rank 0 posts."""

    name = "slack"

    def __init__(self, token: str, channel: str, *, run_name: str = "", base_url: Optional[str] = None,
                 timeout: float = 10.0, log: Callable[[str], None] = print):
        from slack_sdk import WebClient
        kw: dict[str, Any] = {"token": token, "timeout": int(max(1, timeout))}
        if base_url:
            kw["base_url"] = base_url
        self.client = WebClient(**kw)
        self.client.retry_handlers = []  # one try: a slow Slack must not slow training
        self.token, self.channel, self.run_name = token, channel, run_name
        self._log = log
        self.failures = 0

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
            self._log(f"slack: message not sent ({str(reason).replace(self.token, '***')}); "
                      f"training continues")
            return False

    def on_train_start(self, trainer) -> None:
        self.send(f"started: epoch {trainer.epoch + 1}/{trainer.epochs}, {trainer.describe()}")

    def on_epoch_end(self, trainer, epoch: int, metrics: dict[str, float]) -> None:
        self.send(f"epoch {epoch + 1}/{trainer.epochs}: test acc {metrics['test_acc1']:.2f}% "
                  f"(best {trainer.best_acc:.2f}%), train loss {metrics['train_loss']:.4f}, "
                  f"{metrics['images_per_s']:.0f} img/s")

    def on_train_end(self, trainer) -> None:
        self.send(f"finished: best test acc {trainer.best_acc:.2f}%")

    def on_exception(self, trainer, exc: BaseException) -> None:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"crashed: {type(exc).__name__}: {exc}"
        self.send(f"{what} in epoch {trainer.epoch + 1}")
