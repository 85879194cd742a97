from __future__ import annotations

import pytest

from pytest_commbench import regions
from pytest_commbench.verdicts import Rejected, Verdict

TEMPLATE = """import numpy as np


def f(ctx, x, y):
    n = 1
    # >>> COMMBENCH EDIT body
    raise NotImplementedError
    # <<< COMMBENCH EDIT
    return None
"""


def test_parse_finds_region_and_keeps_markers_in_fixed_text():
    p = regions.parse(TEMPLATE)
    assert p.names == ("body",)
    assert p.bodies == ("    raise NotImplementedError\n",)
    assert p.fixed[0].endswith("# >>> COMMBENCH EDIT body\n")
    assert p.fixed[1].startswith("    # <<< COMMBENCH EDIT")


def test_fill_then_verify_accepts_region_edits():
    solution = regions.fill(TEMPLATE, {"body": "    y[:] = x"})
    assert "y[:] = x\n" in solution
    regions.verify(TEMPLATE, solution)


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda s: s.replace("n = 1", "n = 2"), "before the first region"),
        (lambda s: s.replace("return None", "return 0"), "after region 'body'"),
        (lambda s: s.replace("import numpy as np", "import numpy as np\nimport os"), "line"),
        (lambda s: s.replace("    # <<< COMMBENCH EDIT\n", ""), "region markers broken"),
        (lambda s: s.replace("EDIT body", "EDIT other"), "regions are"),
    ],
)
def test_any_change_outside_a_region_is_tampered(edit, needle):
    solution = edit(regions.fill(TEMPLATE, {"body": "    y[:] = x"}))
    with pytest.raises(Rejected) as info:
        regions.verify(TEMPLATE, solution)
    assert info.value.verdict is Verdict.TAMPERED
    assert needle in info.value.message


def test_line_endings_and_trailing_blanks_do_not_count():
    solution = regions.fill(TEMPLATE, {"body": "    y[:] = x"}).replace("\n", "  \r\n") + "\n\n"
    regions.verify(TEMPLATE, solution)


def test_reply_with_only_the_region_in_a_fence_is_merged():
    reply = ("Sure, here it is:\n```python\n    # >>> COMMBENCH EDIT body\n    y[:] = 2 * x\n"
             "    # <<< COMMBENCH EDIT\n```\nHope it helps.")
    solution = regions.merge_reply(TEMPLATE, reply)
    regions.verify(TEMPLATE, solution)
    assert "y[:] = 2 * x" in solution and "n = 1" in solution


def test_reply_with_the_whole_file_is_taken_as_is():
    full = regions.fill(TEMPLATE, {"body": "    y[:] = x"})
    assert regions.merge_reply(TEMPLATE, f"```python\n{full}```") == full


def test_whole_file_reply_that_edits_the_harness_is_tampered():
    full = regions.fill(TEMPLATE, {"body": "    y[:] = x"}).replace("return None", "return 1")
    with pytest.raises(Rejected) as info:
        regions.merge_reply(TEMPLATE, full)
    assert info.value.verdict is Verdict.TAMPERED


@pytest.mark.parametrize("reply", [None, "", "   \n", "I cannot help with that.",
                                   "```python\nprint('no markers')\n```"])
def test_reply_without_code_is_no_solution(reply):
    with pytest.raises(Rejected) as info:
        regions.merge_reply(TEMPLATE, reply)
    assert info.value.verdict is Verdict.NO_SOLUTION


def test_reply_with_unknown_region_is_tampered():
    reply = "# >>> COMMBENCH EDIT nope\nx = 1\n# <<< COMMBENCH EDIT\n"
    with pytest.raises(Rejected) as info:
        regions.merge_reply(TEMPLATE, reply)
    assert info.value.verdict is Verdict.TAMPERED


def test_unbalanced_markers_in_a_template_are_an_error():
    with pytest.raises(regions.RegionSyntaxError):
        regions.parse("# >>> COMMBENCH EDIT a\nx\n")
    with pytest.raises(regions.RegionSyntaxError):
        regions.parse("x\n# <<< COMMBENCH EDIT\n")
