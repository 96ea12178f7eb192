"""How the relpos command reads numbers: decimal only (a leading zero is no
octal prefix), nothing after or around the digits, every value in its
option's declared range (refused naming the option and the range, never
clamped or narrowed), list items never empty, and sizes whose buffers cannot
fit this machine refused before any allocation or GEMM."""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

# The installed command, or the one RELPOS_CLI names (as in test_cli.py).
RELPOS = os.environ.get("RELPOS_CLI", str(pathlib.Path(sys.executable).parent / "relpos"))
TINY_MODEL = ["--layers", "1", "--width", "32", "--heads", "2", "--ffn", "64", "--threads", "1"]


def run(*args, cwd, timeout=30):
    # surrogateescape: sampled text need not be UTF-8
    return subprocess.run([RELPOS, *map(str, args)], capture_output=True, text=True, errors="surrogateescape",
                          timeout=timeout, cwd=cwd)


def refused(args, tmp_path, option, *also):
    """The command line exits 2 at once with a message naming `option` (and `also`)."""
    start = time.monotonic()
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (args, r.returncode, r.stdout[-500:], r.stderr)
    assert option in r.stderr, (args, r.stderr)
    for text in also:
        assert text in r.stderr, (args, r.stderr)
    assert time.monotonic() - start < 10, args  # refused before any work
    return r.stderr


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * i % 97}\n" for i in range(400)))
    return path


# --- leading zeros are decimal ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text,value", [("016", 16), ("010", 10), ("0008", 8), ("09", 9), ("000012", 12)])
def test_check_reads_leading_zeros_as_decimal(text, value, tmp_path):
    report = tmp_path / "check.json"
    r = run("check", "--length", text, "--dim", "0" + str(2 * value), "--batch", "01", "--heads", "01", "--json",
            report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(report.read_text())
    assert (got["length"], got["dim"], got["batch"], got["heads"]) == (value, 2 * value, 1, 1)


def test_bench_lists_read_leading_zeros_as_decimal(tmp_path):
    report = tmp_path / "bench.json"
    r = run("bench", "attention", "--lengths", "010,0016,09", "--dims", "08", "--threads", "01", "--heads", "02",
            "--reps", "01", "--json", report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(report.read_text())
    assert got["heads"] == 2
    assert {(row["length"], row["dim"], row["threads"]) for row in got["rows"]} == {(10, 8, 1), (16, 8, 1), (9, 8, 1)}
    report = tmp_path / "memory.json"
    r = run("bench", "memory", "--lengths", "08,016", "--dim", "010", "--heads", "01", "--json", report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(report.read_text())
    assert (got["dim"], got["heads"], sorted({row["length"] for row in got["rows"]})) == (10, 1, [8, 16])


@pytest.mark.parametrize("length,steps,batch", [("016", "08", "04"), ("010", "09", "03"), ("0012", "011", "02")])
def test_train_reads_leading_zeros_as_decimal(length, steps, batch, data, tmp_path):
    report = tmp_path / "train.json"
    r = run("train", "--data", data, *TINY_MODEL, "--length", length, "--steps", steps, "--batch", batch,
            "--checkpoint", tmp_path / "z.ckpt", "--json", report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(report.read_text())
    assert (got["length"], got["steps"], got["last_step"], got["batch"]) == (
        int(length), int(steps), int(steps), int(batch))


def test_eval_and_sample_read_leading_zeros_as_decimal(data, tmp_path):
    ckpt = tmp_path / "m.ckpt"
    assert run("train", "--data", data, *TINY_MODEL, "--length", "16", "--steps", "2", "--batch", "4",
               "--checkpoint", ckpt, cwd=tmp_path).returncode == 0
    report = tmp_path / "eval.json"
    r = run("eval", "--checkpoint", ckpt, "--multiples", "01,002,04", "--stride", "010", "--batch", "08",
            "--threads", "01", "--json", report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    scores = json.loads(report.read_text())["scores"]
    assert [s["multiple"] for s in scores] == [1, 2, 4]
    assert [s["stride"] for s in scores] == [10, 10, 10]
    out = tmp_path / "sample.json"
    r = run("sample", "--checkpoint", ckpt, "--length", "010", "--top-k", "08", "--seed", "07", "--threads", "1",
            "--json", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert (got["top_k"], got["seed"]) == (8, 7)
    assert len(r.stdout.encode("utf-8", "surrogateescape")) == len("The ") + 10 + 1  # prompt, 10 bytes, newline


def test_an_option_given_twice_takes_the_last_decimal_value(tmp_path):
    report = tmp_path / "check.json"
    r = run("check", "--length", "8", "--length", "012", "--dim", "8", "--batch", "1", "--heads", "1", "--json",
            report, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(report.read_text())["length"] == 12


# --- anything but plain decimal digits is refused ---------------------------------------------------------------

NOT_DECIMAL = ["0x10", "0X10", "0o10", "0b10", "+16", " 16", "16 ", "16abc", "1e3", "16.0", "", "0x", "-", "1-"]


@pytest.mark.parametrize("text", NOT_DECIMAL)
@pytest.mark.parametrize("command,option", [
    (["check"], "--length"),
    (["check"], "--seed"),
    (["train"], "--steps"),
    (["train"], "--length"),
    (["eval", "--checkpoint", "x"], "--batch"),
    (["sample", "--checkpoint", "x"], "--top-k"),
    (["bench", "attention"], "--heads"),
    (["bench", "attention"], "--lengths"),
    (["bench", "attention"], "--dims"),
    (["eval", "--checkpoint", "x"], "--multiples"),
    (["demo"], "--multiples"),
])
def test_integers_that_are_not_plain_decimal_are_refused(command, option, text, tmp_path):
    refused([*command, option, text], tmp_path, option, "decimal")


@pytest.mark.parametrize("text", ["0x1p-3", "0X1P-3", "+1e-3", " 1e-3", "1e-3 ", "1e-3x", "", "1,5", "1e999", "inf",
                                  "-inf", "nan", "0x10"])
@pytest.mark.parametrize("command,option", [
    (["check"], "--tolerance"),
    (["train"], "--lr"),
    (["bench", "memory"], "--budget-gb"),
    (["sample", "--checkpoint", "x"], "--temperature"),
])
def test_numbers_that_are_not_finite_decimals_are_refused(command, option, text, tmp_path):
    refused([*command, option, text], tmp_path, option, "decimal")


# --- out of range: refused naming the option and its range, never clamped or narrowed ---------------------------


@pytest.mark.parametrize("command,option,values,declared", [
    (["train"], "--steps", ["99999999999999999999", "9223372036854775808", "1099511627777", "0", "-1"],
     "[1, 1099511627776]"),
    (["train"], "--layers", ["1025", "4294967297", "0"], "[1, 1024]"),
    (["train"], "--width", ["65537", "2147483648", "4294967328"], "[1, 65536]"),
    (["train"], "--ffn", ["1048577", "2147483648"], "[1, 1048576]"),
    (["train"], "--length", ["16777217", "4294967312", "-16"], "[1, 16777216]"),
    (["train"], "--batch", ["1048577", "4294967296"], "[1, 1048576]"),
    (["demo"], "--jobs", ["4097", "18446744073709551616"], "[0, 4096]"),
    (["demo"], "--stride", ["2147483648", "-1"], "[0, 2147483647]"),
    (["eval", "--checkpoint", "x"], "--batch", ["4294967296", "1048577", "0", "-1"], "[1, 1048576]"),
    (["eval", "--checkpoint", "x"], "--stride", ["2147483648", "4294967296"], "[0, 2147483647]"),
    (["eval", "--checkpoint", "x"], "--multiples", ["1048577", "1,99999999999999999999", "0", "-2"], "[1, 1048576]"),
    (["sample", "--checkpoint", "x"], "--length", ["16777217", "9223372036854775807"], "[1, 16777216]"),
    (["sample", "--checkpoint", "x"], "--top-k", ["257", "4294967296"], "[0, 256]"),
    (["check"], "--length", ["9223372036854775807", "99999999999999999999", "16777217"], "[1, 16777216]"),
    (["check"], "--heads", ["65537", "1099511627776"], "[1, 65536]"),
    (["check"], "--dim", ["16386", "9223372036854775806", "0"], "[2, 16384]"),
    (["check"], "--seed", ["9223372036854775808", "-1"], "[0, 9223372036854775807]"),
    (["bench", "attention"], "--lengths", ["99999999999999999999", "9223372036854775807", "16777217", "8,0"],
     "[1, 16777216]"),
    (["bench", "attention"], "--dims", ["9223372036854775806", "16386"], "[1, 16384]"),
    (["bench", "attention"], "--threads", ["4097", "1,100000"], "[1, 4096]"),
    (["bench", "attention"], "--heads", ["1099511627776", "65537"], "[1, 65536]"),
    (["bench", "attention"], "--reps", ["4294967297", "1048577"], "[1, 1048576]"),
    (["bench", "memory"], "--batch", ["1048577", "18446744073709551615"], "[1, 1048576]"),
])
def test_values_beyond_an_options_range_are_refused_naming_it(command, option, values, declared, tmp_path):
    for value in values:
        item = value.split(",")[-1]  # a list's message quotes the item out of range
        refused([*command, option, value], tmp_path, option, declared, f"'{item}'")


# --- sizes that cannot fit this machine: refused before any allocation or GEMM -----------------------------------


@pytest.mark.parametrize("args,named", [
    (["check", "--length", "16777216"], ["--length 16777216", "--dim 64", "--heads 4", "--batch 2"]),
    (["check", "--length", "1048576", "--batch", "1", "--heads", "1", "--dim", "2"], ["--length 1048576"]),
    # B x H x L x d beyond int64: 2^20 x 2^16 x 2^24 x 2^14
    (["check", "--batch", "1048576", "--heads", "65536", "--length", "16777216", "--dim", "16384"],
     ["--batch 1048576", "--heads 65536", "--length 16777216", "--dim 16384"]),
    (["bench", "attention", "--lengths", "16777216", "--json", ""], ["--lengths 16777216", "--dims 64"]),
    (["bench", "attention", "--lengths", "512,16777216", "--dims", "16384", "--json", ""],
     ["--lengths", "--dims 16384"]),
    (["bench", "attention", "--heads", "65536", "--dims", "16384", "--json", ""], ["--heads 65536", "--dims 16384"]),
    (["bench", "attention", "--batch", "1048576", "--heads", "65536", "--json", ""], ["--batch 1048576"]),
    # the calibration's sgemm buffers alone: a (L x L) result per thread
    (["bench", "attention", "--lengths", "1048576", "--dims", "2", "--heads", "1", "--threads", "4096", "--json", ""],
     ["--lengths 1048576", "--threads 4096"]),
    (["bench", "memory", "--lengths", "16777216", "--heads", "65536", "--json", ""], ["--lengths 16777216"]),
    (["bench", "memory", "--batch", "1048576", "--heads", "65536", "--dim", "16384", "--json", ""],
     ["--batch 1048576", "--dim 16384"]),
    (["train", "--layers", "1024", "--width", "65536", "--ffn", "1048576"],
     ["--layers 1024", "--width 65536", "--ffn 1048576"]),
    (["train", "--batch", "1048576", "--length", "16777216"], ["--batch 1048576", "--length 16777216"]),
    (["train", "--width", "65536", "--heads", "64", "--layers", "1024", "--positions", "xl"], ["--width 65536"]),
    (["demo", "--batch", "1048576", "--length", "16777216"], ["--batch 1048576", "--length 16777216"]),
])
def test_sizes_beyond_this_machines_memory_are_refused_before_any_work(args, named, tmp_path):
    message = refused(args, tmp_path, named[0], *named[1:], "needs about", "GB, more than this machine's")
    assert "vector" not in message and "out of memory" not in message


def test_evaluation_beyond_this_machines_memory_is_refused_before_any_work(data, tmp_path):
    """Transformer-XL's memory evaluation holds a key/value cache per window of a pass:
    2^20 windows x 15 x 16 positions of memory x width 32, keys and values, is over 100 GB."""
    ckpt = tmp_path / "xl.ckpt"
    assert run("train", "--data", data, *TINY_MODEL, "--positions", "xl", "--length", "16", "--steps", "2", "--batch",
               "4", "--checkpoint", ckpt, cwd=tmp_path).returncode == 0
    refused(["eval", "--checkpoint", ckpt, "--batch", "1048576", "--multiples", "16"], tmp_path,
            "windows per pass 1048576", "--multiples 16", "needs about", "GB, more than this machine's")
    r = run("eval", "--checkpoint", ckpt, "--batch", "64", "--multiples", "1,16", "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_sizes_that_fit_still_run(tmp_path):
    r = run("bench", "attention", "--lengths", "64", "--dims", "16", "--heads", "2", "--threads", "1", "--reps", "1",
            "--json", "", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("check", "--length", "24", "--dim", "8", "--batch", "1", "--heads", "2", cwd=tmp_path)
    assert r.returncode == 0 and "all agree" in r.stdout, r.stdout + r.stderr


# --- list items are never empty ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["8,", ",8", "8,,16", "", ",", ",,"])
@pytest.mark.parametrize("command,option", [
    (["bench", "attention"], "--dims"),
    (["bench", "attention"], "--lengths"),
    (["bench", "attention"], "--threads"),
    (["bench", "memory"], "--lengths"),
    (["eval", "--checkpoint", "x"], "--multiples"),
    (["demo"], "--multiples"),
])
def test_lists_with_an_empty_item_are_refused(command, option, text, tmp_path):
    refused([*command, option, text], tmp_path, option, "empty item")


# --- --version and --help take no arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("args,extra", [
    (["--version", "--bogus"], "--bogus"),
    (["-V", "extra"], "extra"),
    (["--version", "--help"], "--help"),
    (["--help", "--bogus"], "--bogus"),
    (["-h", "extra"], "extra"),
    (["help", "train"], "train"),
    (["bench", "--help", "--bogus"], "--bogus"),
    (["bench", "-h", "memory"], "memory"),
    (["check", "--help", "--bogus"], "--bogus"),
    (["check", "--bogus", "--help"], "--bogus"),
    (["bench", "attention", "--help", "extra"], "extra"),
    (["train", "-h", "--bogus"], "--bogus"),
])
def test_version_and_help_refuse_extra_arguments(args, extra, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (args, r.returncode, r.stdout)
    assert f"'{extra}'" in r.stderr and r.stdout == "", (args, r.stderr)


def test_version_and_help_alone_succeed_and_help_says_how_numbers_are_read(tmp_path):
    r = run("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("relpos ")
    for args in (["--help"], ["-h"], ["help"], ["bench", "--help"]):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 0 and "usage: relpos" in r.stdout, args
    for args in (["check", "--help"], ["bench", "attention", "--help"], ["train", "--help"]):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 0, args
        assert "Numbers are decimal" in r.stdout and "016 is 16" in r.stdout, args
    assert "--length INT in [1, 16777216]=128" in run("check", "--help", cwd=tmp_path).stdout
