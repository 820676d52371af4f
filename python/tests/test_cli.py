"""`python -m kvferry` forwards to the bundled `kvferry` command."""

import os
import subprocess
import sys

import kvferry


def test_python_m_kvferry_version():
    out = subprocess.run([sys.executable, "-m", "kvferry", "version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "0.1.0" in out.stdout


def test_python_m_kvferry_bad_command():
    out = subprocess.run([sys.executable, "-m", "kvferry", "no-such-command"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_bundled_paths():
    assert os.path.exists(kvferry.library_path())
    assert os.access(kvferry.binary_path(), os.X_OK)
