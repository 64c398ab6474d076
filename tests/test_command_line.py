"""cde_st.command_line: every numeric option of every command follows one rule (:class:`Number`): a finite number
in its range, else one line ``error: argument --OPTION: expected ..., got 'VALUE'`` and exit status 2, before
anything is loaded or started (``--read-timeout-s nan`` used to start a server that dropped every POST,
``--max-body-mb -1`` one that refused every body, ``--max-body-mb nan`` a bare traceback)."""

from __future__ import annotations

import argparse

import pytest

from cde_st import cli, convert_command
from cde_st.command_line import Number
from cde_st.corpus import commands as corpus_commands
from cde_st.serving.serve_command import build_parser as serve_parser

#: Each command's parser and the arguments it requires besides the option under test.
PARSERS = {
    "cde-st-serve": (serve_parser, ["some-model"]),
    "cde-st-eval": (cli._eval_parser, ["--model", "m", "--tasks", "t"]),
    "cde-st-train": (cli._train_parser, []),
    "cde-st-convert": (convert_command._parser, ["src", "dst"]),
    "cde-st-embed": (corpus_commands._embed_parser, ["m", "corpus", "--out", "o"]),
    "cde-st-search": (corpus_commands._search_parser, ["folder", "a query"]),
}
#: Numeric options whose rule is their own (a word besides the number): the value refused for each.
OWN_RULES = {("cde-st-serve", "--forward-overhead-tokens"): ["-1", "nan", "inf", "many"]}


def _numeric_options():
    for command, (parser, _) in PARSERS.items():
        for action in parser()._actions:
            if action.option_strings and action.type is not None and action.type is not str:
                yield command, action


def test_every_numeric_option_has_a_range():
    """A bare ``type=int`` / ``type=float`` accepts nan, inf or a negative count: every option takes a
    :class:`Number` (or a rule of its own, named in OWN_RULES)."""
    bare = [
        f"{command} {action.option_strings[-1]}"
        for command, action in _numeric_options()
        if action.type in (int, float)
    ]
    assert not bare, f"options without a range: {bare}"


def _refusals():
    for command, action in _numeric_options():
        option = action.option_strings[-1]
        if isinstance(action.type, Number):
            number = action.type
            bad = ["nan", "inf", "-inf", "x", ""]
            below = number.at_least if number.at_least is not None else number.above
            if below is not None:
                bad += [str(below - 1), str(below - 0.5) if number.kind is float else str(int(below) - 1)]
            if number.above is not None:
                bad.append(str(number.above))
            if number.at_most is not None:
                bad.append(str(number.at_most + 1))
            yield from ((command, option, value) for value in dict.fromkeys(bad))
        elif (command, option) in OWN_RULES:
            yield from ((command, option, value) for value in OWN_RULES[command, option])


@pytest.mark.parametrize(("command", "option", "value"), list(_refusals()))
def test_a_bad_number_is_one_line_naming_the_option_exit_2(command, option, value, capsys):
    parser, required = PARSERS[command]
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args([*required, f"{option}={value}"])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0], lines


def test_serve_options_nan_and_negative_once_accepted():
    """The values that started a broken server or ended in a traceback are refused when parsed."""
    for option, value in [
        ("--read-timeout-s", "nan"),
        ("--max-body-mb", "-1"),
        ("--max-body-mb", "nan"),
        ("--context-cache-mb", "nan"),
    ]:
        with pytest.raises(SystemExit):
            serve_parser().parse_args(["m", option, value])


def test_a_number_in_range_is_parsed():
    assert Number(float, above=0)(" 0.5 ") == 0.5 and Number(int, at_least=1)("3") == 3
    assert Number(int, at_least=0, at_most=2**32 - 1).range() == "an integer >= 0 and <= 4294967295"
    assert Number(float, at_least=0.001).range() == "a finite number >= 0.001"
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer >= 1, got '2.5'"):
        Number(int, at_least=1)("2.5")
    args = serve_parser().parse_args(["m", "--max-body-mb", "0.5", "--port", "0", "--forward-overhead-tokens", "off"])
    assert (args.max_body_mb, args.port, args.forward_overhead_tokens) == (0.5, 0, None)


def test_parsing_the_server_s_options_loads_no_heavy_library():
    """``cde-st-serve --help`` and its ``--workers`` parent parse with CommandParser and Number: command_line imports
    torch and the hub client only where they are used."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cde_st.serving.serve_command import build_parser\n"
        "build_parser().parse_args(['m', '--max-body-mb', '2'])\n"
        "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[]"]
