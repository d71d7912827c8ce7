"""Slack never corrupts what a run writes and never holds training up: whole-token
redaction, JSON redacted by value, short and non-UTF-8 tokens refused, a hanging
endpoint posted to from a background thread with a bounded wait at the end."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bfp.cli import cifar as main
from bfp.engine.logs import RunLog
from bfp.engine.redact import pattern, redact_text
from bfp.engine.slack import SlackNotifier, SlackTokenError, read_token

TOKEN = "xoxb-test-secret-token-123"


def test_a_token_is_redacted_only_as_a_whole_token():
    pat = pattern(["0"])
    assert redact_text('"optim_lr": 0.1, 10, x0, 0, 2.0 and 0-1 but (0)', pat) == \
        '"optim_lr": 0.1, 10, x0, ***, 2.0 and 0-1 but (***)'
    pat = pattern([TOKEN])
    assert redact_text(f"token {TOKEN} revoked; {TOKEN}. x{TOKEN} {TOKEN}9", pat) == \
        f"token *** revoked; ***. x{TOKEN} {TOKEN}9"


def test_json_files_are_redacted_by_value_and_stay_valid(tmp_path):
    log = RunLog(tmp_path, redact=("0",))  # a secret this short is refused as a token, not here
    log.write_json("config.json", {"optim_lr": 0.1, "seed": 0, "name": "0", "cmd": ["--seed", "0"], "0": 1})
    log("lr 0.1 seed 0")
    log.close()
    assert json.loads((tmp_path / "config.json").read_text()) == \
        {"optim_lr": 0.1, "seed": 0, "name": "***", "cmd": ["--seed", "***"], "***": 1}
    assert (tmp_path / "log.txt").read_text().endswith(" lr 0.1 seed ***\n")


@pytest.mark.parametrize("token", ["0", "xoxb-short"])
def test_a_token_shorter_than_a_real_one_is_refused(tiny_args, tmp_path, monkeypatch, capsys, token):
    monkeypatch.setenv("BFP_SLACK_TOKEN", token)
    assert main(tiny_args("--slackbot", "True", "--log", "True", "--run-name", "t")) == 2
    err = capsys.readouterr().err
    assert f"has {len(token)} characters" in err and "$BFP_SLACK_TOKEN" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "t").exists()


def test_a_token_file_that_is_not_utf8_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("BFP_SLACK_TOKEN", raising=False)
    (tmp_path / "slackbot.token").write_bytes(b"xoxb-\xff\xfe-0123456789012345678901")
    with pytest.raises(SlackTokenError, match=r"slackbot\.token' is not UTF-8 text \(byte 5: b'\\xff'\)"):
        read_token(tmp_path / "slackbot.token")


class _HungSlack:
    """Accepts requests and answers none until ``release`` is set."""

    def __init__(self):
        self.arrived, self.release, self.count = threading.Event(), threading.Event(), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.count += 1
                outer.arrived.set()
                outer.release.wait(60)
                self.send_response(500)
                self.end_headers()

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class _Trainer:
    epoch, epochs, best_acc = 0, 3, 50.0

    def describe(self):
        return "tiny"


def test_a_hanging_endpoint_never_holds_training_and_the_end_waits_a_bounded_time():
    hung = _HungSlack()
    logged = []
    n = SlackNotifier(TOKEN, "#x", base_url=hung.url, timeout=60, drain_timeout=0.2, log=logged.append)
    try:
        t = _Trainer()
        n.on_train_start(t)
        assert hung.arrived.wait(30), "the first message never reached the server"
        for epoch in range(3):  # the server still holds the first request: these only queue
            n.on_epoch_end(t, epoch, {"test_acc1": 50.0, "train_loss": 1.0, "images_per_s": 10.0})
        assert hung.count == 1 and n._queue.qsize() == 3
        n.on_train_end(t)  # waits drain_timeout, not the HTTP timeout, then gives up
        assert logged == ["slack: messages still unsent after 0.2 s; giving up on them"]
        assert hung.count == 1
    finally:
        hung.release.set()
        hung.server.shutdown()
        hung.server.server_close()
