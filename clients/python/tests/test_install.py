"""The package installs with pip into a fresh venv (as a user installs
it: pip builds it with setuptools from the package index) and works there: the client, the handles and
the replica runtime, as its console script and as python -m."""

import os
import subprocess
import sys
import time
import urllib.request

PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_pip_installs_it_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PACKAGE], check=True,
                   capture_output=True, cwd=tmp_path)
    out = subprocess.run([python, "-c", "import servemesh, servemesh.replica, servemesh.handle; "
                          "print(servemesh.__file__); print(servemesh.Client('127.0.0.1:1', wait=False)._wait)"],
                         check=True, capture_output=True, text=True, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(venv)) and out[1] == "False", out  # the installed copy, not this folder's
    (tmp_path / "tiny.py").write_text("class Tiny:\n    def __call__(self, request):\n        return {'ok': True}\n")
    for command in ([str(venv / "bin" / "servemesh-replica")], [python, "-m", "servemesh.replica"]):
        proc = subprocess.Popen(command + ["--path", str(tmp_path), "--port", "0", "tiny:Tiny"], stdout=subprocess.PIPE, text=True,
                                cwd=tmp_path, env={"PATH": os.environ["PATH"]})
        try:
            line = proc.stdout.readline()
            assert "serving tiny:Tiny (threads) on 127.0.0.1:" in line, line  # no uvicorn here: the standard library's server
            url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
            deadline = time.monotonic() + 10
            while True:
                try:
                    with urllib.request.urlopen(url + "/-/healthz", timeout=2) as resp:
                        assert resp.status == 200
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(10)
