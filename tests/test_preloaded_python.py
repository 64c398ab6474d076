"""The tests' ``run_python`` behaves as ``subprocess.run([sys.executable, ...])`` would: arguments, working
directory, environment, output, exit status and a time limit; a run whose import-time environment differs from
the forkserver's gets a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from preloaded_python import run_python


def test_script_module_and_code_run_as_python_runs_them(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os, sys\nprint(sys.argv[1:], os.getcwd(), os.environ['MARK'])\nsys.exit(3)\n")
    env = dict(os.environ, MARK="seen")
    run = run_python([str(script), "a", "b"], cwd=tmp_path, env=env)
    assert (run.returncode, run.stdout.strip()) == (3, f"['a', 'b'] {tmp_path} seen")
    args = ["-m", "json.tool", str(tmp_path / "missing.json")]
    module, real = run_python(args), subprocess.run([sys.executable, *args], capture_output=True, text=True)
    assert module.returncode == real.returncode != 0 and module.stderr == real.stderr
    code = run_python(["-c", "import sys; print(sys.argv); raise ValueError('boom')", "x"])
    assert code.returncode == 1 and code.stdout.strip() == "['-c', 'x']"
    assert code.stderr.rstrip().endswith("ValueError: boom")
    message = run_python(["-c", "raise SystemExit('a message')"])
    assert (message.returncode, message.stderr.strip()) == (1, "a message")


def test_each_run_is_a_process_of_its_own():
    first = run_python(["-c", "import os; print(os.getpid())"])
    second = run_python(["-c", "import os; print(os.getpid())"])
    assert first.stdout != second.stdout and str(os.getpid()) not in (first.stdout, second.stdout)


def test_a_run_past_its_time_limit_is_stopped():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; time.sleep(60)"], timeout=1)


def test_another_import_time_environment_gets_a_fresh_interpreter():
    code = "import sys; print('torch' in sys.modules)"
    assert run_python(["-c", code]).stdout.strip() == "True"  # preloaded
    fresh = run_python(["-c", code], env=dict(os.environ, HF_HOME=os.environ.get("HF_HOME", "") + "-other"))
    assert fresh.stdout.strip() == "False" and fresh.args[0] == sys.executable


def test_a_started_process_takes_signals_and_writes_its_log(tmp_path):
    import signal
    import time

    from preloaded_python import start_python

    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('drained', flush=True), sys.exit(0)))\n"
        "print('up', flush=True); print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "log"
    process = start_python(["-c", code], log=log)
    deadline = time.monotonic() + 60
    while "to stderr" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None and process.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0 and log.read_text().split("\n")[:3] == ["up", "to stderr", "drained"]
    killed = start_python(["-c", "import time; time.sleep(60)"], log=tmp_path / "killed")
    killed.kill()
    assert killed.wait(timeout=30) == -signal.SIGKILL
