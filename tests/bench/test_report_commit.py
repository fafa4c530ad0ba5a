"""A bench result names the commit whose code ran: the checkout's short hash, marked `-dirty` when tracked files
differ from it, or CHORUS_COMMIT where the caller knows better. A real git repository in a temporary folder."""

from __future__ import annotations

import subprocess

from chorus.bench.report import commit


def _git(repo, *args: str) -> str:
    identity = ["-c", "user.email=bench@chorus.test", "-c", "user.name=bench"]
    return subprocess.run(["git", *identity, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_a_result_names_the_commit_and_whether_the_tree_differs_from_it(tmp_path, monkeypatch):
    monkeypatch.delenv("CHORUS_COMMIT", raising=False)
    _git(tmp_path, "init", "-q")
    (tmp_path / "engine.py").write_text("STEP_MS = 4.7\n")
    _git(tmp_path, "add", "engine.py")
    _git(tmp_path, "commit", "-q", "-m", "engine")
    _git(tmp_path, "tag", "v1")  # a tag is never given instead of the hash
    head = _git(tmp_path, "rev-parse", "--short=7", "HEAD").strip()
    assert commit(tmp_path) == head
    (tmp_path / "engine.py").write_text("STEP_MS = 4.3\n")
    assert commit(tmp_path) == f"{head}-dirty"
    monkeypatch.setenv("CHORUS_COMMIT", "abc1234")
    assert commit(tmp_path) == "abc1234"


def test_outside_a_repository_the_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("CHORUS_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert commit(tmp_path) == "unknown"
