"""The relpos command on bad input and interruptions: every probe ends in a
message naming the problem and a non-zero exit (2 for a bad command line),
never a crash, a hang, a narrowed number or lost work."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

# The installed command, or the one RELPOS_CLI names (the AVX2 stage of scripts/test.sh).
RELPOS = os.environ.get("RELPOS_CLI", str(pathlib.Path(sys.executable).parent / "relpos"))
TINY = ["--length", "16", "--layers", "1", "--width", "32", "--heads", "2", "--ffn", "64", "--batch", "4",
        "--threads", "1", "--positions", "alibi"]


def run(*args, timeout=60, **kw):
    return subprocess.run([RELPOS, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * i % 97}\n" for i in range(400)))
    return path


@pytest.mark.parametrize("args,option", [
    (["train", "--layers", "4294967297"], "--layers"),
    (["train", "--width", "4294967328"], "--width"),
    (["train", "--length", "4294967312"], "--length"),
    (["train", "--threads", "100000"], "--threads"),
    (["eval", "--checkpoint", "x", "--threads", "100000"], "--threads"),
    (["eval", "--checkpoint", "x", "--multiples", "1152921504606846977"], "--multiples"),
    (["sample", "--checkpoint", "x", "--length", "9223372036854775807"], "--length"),
    (["check", "--tolerance", "-1"], "--tolerance"),
    (["check", "--tolerance", "nan"], "--tolerance"),
    (["check", "--dtype", "float8"], "--dtype"),
    (["train", "--dtype", "fp16"], "--dtype"),
    (["bench", "attention", "--dtype", "int8"], "--dtype"),
    (["bench", "memory", "--budget-gb", "-1"], "--budget-gb"),
    (["bench", "memory", "--budget-gb", "nan"], "--budget-gb"),
    (["train", "--lr", "inf"], "--lr"),
    (["train", "--attention-dropout", "1"], "--attention-dropout"),
    (["train", "--attention-dropout", "-0.1"], "--attention-dropout"),
    (["demo", "--attention-dropout", "nan"], "--attention-dropout"),
    (["demo", "--steps", "0"], "--steps"),
    (["train", "--positions", "bogus"], "--positions"),
    (["demo", "--positions", "alibi,bogus"], "--positions"),
    (["demo", "--positions", "alibi,"], "--positions"),
    (["demo", "--positions", "alibi,,rope"], "--positions"),
    (["demo", "--positions", "alibi,alibi"], "--positions"),
])
def test_out_of_range_options_are_refused_naming_them(args, option, tmp_path):
    # In an empty directory: a results/ left in the working directory by an
    # earlier run (an existing checkpoint is refused first) changes no answer.
    r = run(*args, timeout=20, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert option in r.stderr


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_check_in_half_storage_meets_the_rule_for_every_algorithm(dtype, tmp_path):
    """relpos check --dtype: every scheme x algorithm stored in the half type, its
    errors against float64 at most twice float32's rounded ones, and sane."""
    report = tmp_path / "check.json"
    r = run("check", "--dtype", dtype, "--length", "40", "--json", report, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(report.read_text())
    assert got["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype] and len(got["rows"]) >= 30
    for row in got["rows"]:
        assert row["ok"] and row["fwd_error"] <= 2 * row["float32_fwd_error"], row
        assert row["bwd_error"] <= 2 * row["float32_bwd_error"] < 0.05, row


def test_checkpoint_that_cannot_be_written_is_refused_before_training(data, tmp_path):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for target, why in ((folder, "is a folder"), (blocker / "run.ckpt", "cannot create folder")):
        start = time.monotonic()
        r = run("train", "--data", data, *TINY, "--steps", "1000000", "--checkpoint", target)
        assert r.returncode == 1 and why in r.stderr, r.stderr
        assert time.monotonic() - start < 20  # refused at once, not after a million steps


def test_demo_output_that_cannot_be_written_is_refused_before_training(data, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run("demo", "--data", data, "--out", blocker / "demo", "--steps", "100000", "--length", "8")
    assert r.returncode == 1 and "cannot create folder" in r.stderr and "demo 1/" not in r.stderr


def test_checkpoint_path_that_is_a_folder_is_named(tmp_path):
    r = run("eval", "--checkpoint", tmp_path)
    assert r.returncode == 1 and "is a folder, not a checkpoint file" in r.stderr


def test_existing_checkpoint_of_another_run_needs_force(data, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    assert run("train", "--data", data, *TINY, "--steps", "3", "--checkpoint", ckpt).returncode == 0
    before = ckpt.read_bytes()
    r = run("train", "--data", data, *TINY, "--steps", "3", "--seed", "2", "--checkpoint", ckpt)
    assert r.returncode == 2 and "--force" in r.stderr and ckpt.read_bytes() == before
    assert run("train", "--data", data, *TINY, "--steps", "3", "--seed", "2", "--checkpoint", ckpt,
               "--force").returncode == 0
    assert ckpt.read_bytes() != before


def test_resume_takes_the_options_from_the_checkpoint_and_extends_a_finished_run(data, tmp_path):
    ckpt, part = tmp_path / "r.ckpt", tmp_path / "part.json"
    assert run("train", "--data", data, *TINY, "--steps", "4", "--checkpoint", ckpt).returncode == 0
    # only --resume and the new step count: every other option comes from the checkpoint
    r = run("train", "--checkpoint", ckpt, "--resume", "--steps", "8", "--json", part)
    assert r.returncode == 0, r.stderr
    assert "extended from 4" in r.stderr
    assert json.loads(part.read_text())["first_step"] == 4
    r = run("train", "--checkpoint", ckpt, "--resume", "--width", "64")
    assert r.returncode == 2 and "width: 32 in the checkpoint, 64 requested" in r.stderr
    r = run("train", "--checkpoint", ckpt, "--resume", "--steps", "5")
    assert r.returncode == 2 and "8 steps already" in r.stderr


def test_bf16_training_is_recorded_and_its_checkpoint_evaluates_in_bf16(data, tmp_path):
    ckpt, out = tmp_path / "bf16.ckpt", tmp_path / "train.json"
    r = run("train", "--data", data, *TINY, "--steps", "4", "--dtype", "bf16", "--checkpoint", ckpt, "--json", out)
    assert r.returncode == 0, r.stderr
    assert "bfloat16" in r.stderr and json.loads(out.read_text())["dtype"] == "bfloat16"
    r = run("eval", "--checkpoint", ckpt, "--multiples", "1", "--max-bytes", "2000")
    assert r.returncode == 0 and "in bfloat16" in r.stdout, r.stderr
    r = run("train", "--checkpoint", ckpt, "--resume", "--steps", "6", "--dtype", "float32")
    assert r.returncode == 1 and "precision: bfloat16 in the checkpoint, float32 requested" in r.stderr


def test_dtype_auto_trains_in_bf16_exactly_where_the_cpu_multiplies_bfloat16(data, tmp_path):
    out = tmp_path / "auto.json"
    r = run("train", "--data", data, *TINY, "--steps", "2", "--dtype", "auto", "--checkpoint", tmp_path / "a.ckpt",
            "--json", out)
    assert r.returncode == 0, r.stderr
    assert run("info", "--json", tmp_path / "info.json").returncode == 0
    native = json.loads((tmp_path / "info.json").read_text())["gemm_bf16"].startswith("bfloat16 products")
    assert json.loads(out.read_text())["dtype"] == ("bfloat16" if native else "float32")
    r = run("train", "--data", data, *TINY, "--dtype", "bf32", "--checkpoint", tmp_path / "b.ckpt")
    assert r.returncode == 2 and "--dtype: expected float32, bf16 (bfloat16) or auto, got 'bf32'" in r.stderr


def test_attention_dropout_is_recorded_and_a_stopped_run_resumes_exactly(data, tmp_path):
    """--attention-dropout: in the header, the JSON and the checkpoint; steps 4-6 after a
    stop at 3 have the losses of one run of 6; a resume must ask for the same p."""
    whole, part, ckpt = tmp_path / "whole.json", tmp_path / "part.json", tmp_path / "d.ckpt"
    args = ["train", "--data", data, *TINY, "--steps", "6", "--attention-dropout", "0.1"]
    r = run(*args, "--checkpoint", tmp_path / "whole.ckpt", "--json", whole)
    assert r.returncode == 0 and "attention dropout 0.1" in r.stderr, r.stderr
    assert json.loads(whole.read_text())["attention_dropout"] == 0.1
    assert run(*args, "--checkpoint", ckpt, "--stop-after", "3").returncode == 0
    r = run("train", "--checkpoint", ckpt, "--resume", "--json", part)  # p from the checkpoint
    assert r.returncode == 0 and "attention dropout 0.1" in r.stderr, r.stderr
    assert json.loads(part.read_text())["losses"] == json.loads(whole.read_text())["losses"][3:]
    r = run("train", "--checkpoint", ckpt, "--resume", "--steps", "8", "--attention-dropout", "0.2")
    assert r.returncode == 1 and "attention_dropout: 0.1 in the checkpoint, 0.2 requested" in r.stderr, r.stderr
    r = run("train", "--data", data, *TINY, "--steps", "6", "--checkpoint", tmp_path / "plain.ckpt",
            "--json", tmp_path / "plain.json")
    assert r.returncode == 0 and "no attention dropout" in r.stderr, r.stderr
    assert json.loads((tmp_path / "plain.json").read_text())["losses"] != json.loads(whole.read_text())["losses"]


def test_sigint_writes_the_checkpoint_and_json_and_a_resume_finishes(data, tmp_path):
    ckpt, report = tmp_path / "s.ckpt", tmp_path / "s.json"
    proc = subprocess.Popen([RELPOS, "train", "--data", str(data), *TINY, "--steps", "10000000", "--checkpoint",
                             str(ckpt), "--json", str(report), "--checkpoint-every", "0"],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "stopped by SIGINT" in err and "--resume" in err
    got = json.loads(report.read_text())
    assert got["interrupted_by"] == "SIGINT" and got["last_step"] > 0 and len(got["losses"]) == got["last_step"]
    r = run("train", "--checkpoint", ckpt, "--resume", "--steps", got["last_step"] + 3)
    assert r.returncode == 0, r.stderr
    assert f"resuming at step {got['last_step']}" in r.stderr


def test_sigterm_stops_after_the_step_and_a_signal_elsewhere_ends_the_process(data, tmp_path):
    """SIGTERM stops training like SIGINT (exit 128 + 15, checkpoint written); a
    command that saves nothing (a long benchmark) ends at once on SIGINT, as by
    the default action."""
    ckpt = tmp_path / "t.ckpt"
    proc = subprocess.Popen([RELPOS, "train", "--data", str(data), *TINY, "--steps", "10000000", "--checkpoint",
                             str(ckpt), "--checkpoint-every", "0"], stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and ckpt.exists()
    bench = subprocess.Popen([RELPOS, "bench", "attention", "--lengths", "8192", "--dims", "128", "--threads", "1",
                              "--reps", "50", "--json", ""], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.5)
    start = time.monotonic()
    bench.send_signal(signal.SIGINT)
    bench.communicate(timeout=60)
    assert bench.returncode == -signal.SIGINT and time.monotonic() - start < 5


def test_stale_temporaries_of_dead_writers_are_removed(data, tmp_path):
    ckpt = tmp_path / "t.ckpt"
    child = subprocess.Popen(["true"])  # a writer that has ended, as after kill -9 during a save
    child.wait()
    stale = tmp_path / f".t.ckpt.{child.pid}.Ab12Cd"
    stale.write_bytes(b"half a checkpoint")
    assert run("train", "--data", data, *TINY, "--steps", "2", "--checkpoint", ckpt).returncode == 0
    assert not stale.exists() and ckpt.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".t.ckpt")] == []


def test_json_output_is_valid_utf8_with_full_precision(data, tmp_path):
    ckpt, out, report = tmp_path / "u.ckpt", tmp_path / "u.json", tmp_path / "t.json"
    assert run("train", "--data", data, *TINY, "--steps", "2", "--checkpoint", ckpt, "--json", report).returncode == 0
    losses = json.loads(report.read_text())["losses"]
    assert all(float(np.float32(x)) == x for x in losses)  # each loss exactly, not rounded to a few digits
    assert any(len(repr(x)) > 12 for x in losses)
    # generated bytes need not be UTF-8; the JSON stays valid UTF-8 and keeps the prompt's characters
    r = subprocess.run([RELPOS, "sample", "--checkpoint", str(ckpt), "--prompt", "Grüße ", "--length", "40",
                        "--threads", "1", "--json", str(out)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_bytes().decode("utf-8"))
    assert got["prompt"] == "Grüße " and len(got["text"]) > 0


def test_the_command_runs_openmp_with_the_passive_wait_policy(data, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.Popen([RELPOS, "train", "--data", str(data), *TINY, "--steps", "10000000", "--checkpoint",
                             str(tmp_path / "p.ckpt")], stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(1.0)
        environ = pathlib.Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"OMP_WAIT_POLICY=passive" in environ
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


# One name for the position option(s): --positions, in every command that
# trains schemes; the earlier --position still works, with a hint.
HINT = "--position is spelled --positions; accepted"


def test_train_takes_positions_as_demo_does(data, tmp_path):
    out = tmp_path / "train.json"
    r = run("train", "--data", data, *TINY, "--positions", "rope", "--steps", "2", "--checkpoint",
            tmp_path / "r.ckpt", "--json", out)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["position"] == "rope" and HINT not in r.stderr
    r = run("train", "--data", data, *TINY, "--positions", "rope,alibi", "--checkpoint", tmp_path / "x.ckpt")
    assert r.returncode == 2 and "--positions" in r.stderr and "relpos demo" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["train", "demo"])
def test_the_old_spelling_position_is_accepted_with_a_one_line_hint(command, data, tmp_path):
    out = tmp_path / "out.json"
    tiny = [a for a in TINY if a not in ("--positions", "alibi")]
    args = [command, "--data", data, *tiny, "--position", "kerple", "--steps", "2", "--json", out]
    args += ["--checkpoint", tmp_path / "k.ckpt"] if command == "train" else [
        "--out", tmp_path / "demo", "--multiples", "1", "--max-bytes", "200", "--no-sliding"]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(HINT) == 1 and f"relpos {command}: {HINT}\n" in r.stderr, r.stderr
    got = json.loads(out.read_text())
    trained = [got["position"]] if command == "train" else [s["position"] for s in got["schemes"]]
    assert trained == ["kerple"]
    # --resume parses the command line twice: still one hint
    if command == "train":
        r = run("train", "--checkpoint", tmp_path / "k.ckpt", "--resume", "--position", "kerple", "--steps", "3")
        assert r.returncode == 0 and r.stderr.count(HINT) == 1, r.stderr
    # both spellings at once: refused, naming the one to keep
    r = run(command, "--position", "alibi", "--positions", "rope", cwd=tmp_path)
    assert r.returncode == 2 and "--positions; give it once" in r.stderr, r.stderr


def commands_of(help_text):
    """The names of the command list in `relpos --help` or `relpos bench --help`."""
    lines = help_text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("commands:")
                 or line.rstrip() == "benchmarks:")
    names = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        names.append(line.split()[0])
    return names


def every_help():
    """(command line, its --help) for every command and benchmark the CLI lists."""
    top = run("--help")
    assert top.returncode == 0
    helps = [(["--help"], top.stdout)]
    for command in commands_of(top.stdout):
        r = run(command, "--help")
        assert r.returncode == 0, (command, r.stderr)
        helps.append(([command, "--help"], r.stdout))
        if command == "bench":
            for benchmark in commands_of(r.stdout):
                b = run("bench", benchmark, "--help")
                assert b.returncode == 0, (benchmark, b.stderr)
                helps.append((["bench", benchmark, "--help"], b.stdout))
    return helps


def test_relpos_help_lists_every_command_info_included():
    listed = commands_of(run("--help").stdout)
    assert set(listed) >= {"demo", "train", "eval", "sample", "check", "bench", "info"}, listed
    assert commands_of(run("bench", "--help").stdout) == ["memory", "attention"]


def test_every_help_names_every_scheme():
    """Each scheme of the library on a line (the Python package's list, KERPLE's two forms among
    them) by its name in every help, the schemes on a grid (no trainer kinds, nor check's or
    bench's) in the top help and info's, and no help offers the old spelling --position."""
    import re

    from relpos.schemes import SCHEMES

    assert {"kerple", "kerple_power"} <= set(SCHEMES)
    for args, text in every_help():
        for name, cls in SCHEMES.items():
            if not cls._grid or args in (["--help"], ["info", "--help"]):
                assert re.search(rf"(?<![\w-]){name}(?![\w-])", text), (args, name)
        assert not re.search(r"--position(?!s)", text), args
