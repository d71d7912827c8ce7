"""``--help`` of the training scripts: at most one default per flag, never ``(default: None)``."""
import re

from bfp.cli.flags import build_parser
from bfp.cli.tasks import TASKS


def flag_entries(help_text: str) -> dict[str, str]:
    """Each option's help entry (its lines up to the next option), keyed by its first option string."""
    entries, key = {}, None
    for line in help_text.splitlines():
        m = re.match(r"^  (-{1,2}[\w-]+)", line)
        if m:
            key = m.group(1)
            entries[key] = line
        elif key and line.startswith("    "):
            entries[key] += " " + line.strip()
        else:
            key = None
    return entries


def test_every_flag_states_its_default_at_most_once_and_never_none():
    for task in TASKS.values():
        entries = flag_entries(build_parser(task).format_help())
        assert len(entries) > 40
        for flag, text in entries.items():
            assert text.count("(default") <= 1, text
            assert "(default: None)" not in text, text


def test_flags_with_a_derived_default_say_it_in_their_own_words():
    entries = flag_entries(build_parser(TASKS["cifar"]).format_help())
    assert entries["--training-epochs"].endswith("(default: 4 for digits, 200 otherwise)")
    for flag in ("-dp", "--run-name", "--config-out"):
        assert entries[flag].count("(default") == 1, entries[flag]
    assert "(default: 128)" in entries["--batch-size-train"]   # plain defaults still shown
    assert "(default: 0)" in entries["--threads"]              # "their defaults" in the text is no default
