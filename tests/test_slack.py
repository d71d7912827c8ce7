"""Slack progress messages against a local HTTP server standing in for the Slack API."""
import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bfp.cli import cifar as main
from bfp.engine.slack import SlackNotifier, read_token

TOKEN = "xoxb-test-secret-token-123"


class FakeSlack:
    def __init__(self, reply):
        self.reply, self.posts = reply, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                ctype = self.headers.get("Content-Type", "")
                fields = json.loads(body) if "json" in ctype else dict(urllib.parse.parse_qsl(body))
                outer.posts.append({"path": self.path, "auth": self.headers.get("Authorization"), **fields})
                data = json.dumps(outer.reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slack():
    servers = []

    def make(reply):
        servers.append(FakeSlack(reply))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def _everything_written(run_dir, capsys):
    out = capsys.readouterr()
    files = "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()
                    and p.suffix in (".txt", ".json", ".jsonl"))
    return out.out + out.err + files


def test_run_posts_start_epochs_and_finish(slack, tiny_args, tmp_path, monkeypatch, capsys):
    fake = slack({"ok": True, "channel": "C1", "ts": "1.0"})
    monkeypatch.setenv("BFP_SLACK_TOKEN", TOKEN)
    args = tiny_args("--training-epochs", "2", "--log", "True", "--slackbot", "True",
                     "--slack-channel", "#runs", "--slack-base-url", fake.url, "--run-name", "s")
    assert main(args) == 0
    texts = [p["text"] for p in fake.posts]
    assert [p["path"] for p in fake.posts] == ["/api/chat.postMessage"] * 4
    assert all(p["channel"] == "#runs" and p["auth"] == f"Bearer {TOKEN}" for p in fake.posts)
    assert "started" in texts[0] and "epoch 1/2" in texts[1] and "epoch 2/2" in texts[2]
    assert "finished" in texts[3] and all(t.startswith("[s] ") for t in texts)
    assert TOKEN not in _everything_written(tmp_path / "runs" / "s", capsys)


def test_auth_failure_is_logged_without_the_token_and_training_goes_on(slack, tiny_args, tmp_path,
                                                                        monkeypatch, capsys):
    fake = slack({"ok": False, "error": "invalid_auth"})
    monkeypatch.setenv("BFP_SLACK_TOKEN", TOKEN)
    args = tiny_args("--training-epochs", "1", "--log", "True", "--slackbot", "True",
                     "--slack-base-url", fake.url, "--run-name", "a")
    assert main(args) == 0
    written = _everything_written(tmp_path / "runs" / "a", capsys)
    assert "message not sent (invalid_auth)" in written and TOKEN not in written
    assert (tmp_path / "runs" / "a" / "metrics.jsonl").read_text().count("\n") == 1


def test_an_error_that_quotes_the_token_is_logged_redacted(slack, tiny_args, tmp_path, monkeypatch, capsys):
    fake = slack({"ok": False, "error": f"token {TOKEN} revoked"})
    logged = []
    n = SlackNotifier(TOKEN, "#x", base_url=fake.url, log=logged.append)
    assert n.send("hello") is False and logged == ["slack: message not sent (token *** revoked); training continues"]
    monkeypatch.setenv("BFP_SLACK_TOKEN", TOKEN)
    assert main(tiny_args("--training-epochs", "1", "--log", "True", "--save", "True", "--slackbot", "True",
                          "--slack-base-url", fake.url, "--run-name", "q")) == 0
    written = _everything_written(tmp_path / "runs" / "q", capsys)
    assert "token *** revoked" in written and TOKEN not in written
    assert not any(TOKEN.encode() in p.read_bytes() for p in (tmp_path / "runs" / "q").rglob("*") if p.is_file())


def test_unreachable_server_never_stops_training(tmp_path):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logged = []
    n = SlackNotifier(TOKEN, "#x", base_url=f"http://127.0.0.1:{port}/api/", timeout=2, log=logged.append)
    assert n.send("hello") is False
    assert n.failures == 1 and "not sent" in logged[0] and TOKEN not in logged[0]


def test_crash_message(slack):
    fake = slack({"ok": True})
    n = SlackNotifier(TOKEN, "#x", base_url=fake.url, log=print)

    class T:
        epoch = 2
    n.on_exception(T(), RuntimeError("loss is nan"))
    assert fake.posts[0]["text"] == "crashed: RuntimeError: loss is nan in epoch 3"


def test_token_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("BFP_SLACK_TOKEN", raising=False)
    assert read_token(tmp_path / "slackbot.token") is None
    (tmp_path / "slackbot.token").write_text(" xoxb-file-0123456789-abcdef \n")
    assert read_token(tmp_path / "slackbot.token") == "xoxb-file-0123456789-abcdef"
    monkeypatch.setenv("BFP_SLACK_TOKEN", "xoxb-env-0123456789-abcdefgh")
    assert read_token(tmp_path / "slackbot.token") == "xoxb-env-0123456789-abcdefgh"


def test_missing_token_is_reported_and_training_runs(tiny_args, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BFP_SLACK_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(tiny_args("--training-epochs", "1", "--slackbot", "True")) == 0
    assert "no token" in capsys.readouterr().out
