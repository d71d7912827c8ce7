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
    pat = pattern([TOKEN])  # a token as long as a real one goes wherever it stands, escaped forms too
    assert redact_text(f"token {TOKEN} revoked; {TOKEN}. x{TOKEN} {TOKEN}9", pat) == \
        "token *** revoked; ***. x*** ***9"


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


class _EchoSlack:
    """Refuses every post with an error that quotes the Authorization header it got."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.dumps({"ok": False, "error": f"invalid_auth ({self.headers.get('Authorization')})"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _pieces(secret: str, n: int = 8) -> set[str]:
    return {secret[i:i + n] for i in range(len(secret) - n + 1)}


def _leaks(text: str, secret: str) -> list[str]:
    return sorted(p for p in _pieces(secret) if p in text)


LONG_TOKEN = "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"


def test_a_token_file_with_a_comment_line_is_read_as_its_first_line_and_never_leaks(
        tiny_args, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BFP_SLACK_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slackbot.token").write_text(f"\n{LONG_TOKEN}\n# bot of the lab, expires 2027\n")
    assert read_token(tmp_path / "slackbot.token") == LONG_TOKEN
    echo = _EchoSlack()
    try:
        assert main(tiny_args("--slackbot", "True", "--log", "True", "--run-name", "t", "--training-epochs", "1",
                              "--slack-base-url", echo.url)) == 0
    finally:
        echo.server.shutdown()
        echo.server.server_close()
    out = capsys.readouterr()
    run = tmp_path / "runs" / "t"
    written = "".join(p.read_bytes().decode("latin-1") for p in run.rglob("*") if p.is_file())
    assert "invalid_auth (Bearer ***)" in (run / "log.txt").read_text()  # the error was logged, masked
    assert _leaks(out.out + out.err + written, LONG_TOKEN) == []


@pytest.mark.parametrize("form", ["raw", "repr", "escaped", "bytes", "json", "header"])
def test_every_form_a_message_can_carry_the_token_in_is_masked(tmp_path, form, capsys):
    msg = {"raw": f"auth failed for {LONG_TOKEN}",
           "repr": repr(f"line\n{LONG_TOKEN}\tnext"),
           "escaped": f"'Bearer {LONG_TOKEN}\\n# bot'",
           "bytes": str(f"Bearer {LONG_TOKEN}".encode()),
           "json": json.dumps({"token": f"\n{LONG_TOKEN}"}),
           "header": f"Authorization: Bearer{LONG_TOKEN}"}[form]
    log = RunLog(tmp_path, redact=(LONG_TOKEN,))
    log(msg)
    log.write_json("m.json", {"message": msg})
    log.close()
    written = (tmp_path / "log.txt").read_text() + (tmp_path / "m.json").read_text()
    out = capsys.readouterr()
    assert "***" in written and _leaks(written + out.out + out.err, LONG_TOKEN) == []


@pytest.mark.parametrize("bad, what", [(f"{LONG_TOKEN} # bot", f"a space at position {len(LONG_TOKEN) + 1}"),
                                       (f"{LONG_TOKEN}\x07", f"a control character at position {len(LONG_TOKEN) + 1}"),
                                       (f"{LONG_TOKEN}\u00e9", f"a non-ASCII character at position {len(LONG_TOKEN) + 1}")])
def test_a_token_with_a_space_control_or_non_ascii_character_is_refused_without_quoting_it(
        tmp_path, monkeypatch, bad, what):
    monkeypatch.setenv("BFP_SLACK_TOKEN", bad)
    with pytest.raises(SlackTokenError) as e:
        read_token(tmp_path / "none")
    assert what in str(e.value) and "$BFP_SLACK_TOKEN" in str(e.value) and _leaks(str(e.value), LONG_TOKEN) == []
