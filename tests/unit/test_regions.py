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


# -- lines are the compiler's lines ------------------------------------------------------------

GUARDED = """def f(ctx, x, y):
    # >>> COMMBENCH EDIT body
    raise NotImplementedError
    # <<< COMMBENCH EDIT
    # the harness checks what the region wrote
    check(y)
"""


@pytest.mark.parametrize("brk", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_fixed_line_hidden_in_a_comment_by_a_non_newline_break_is_tampered(brk):
    """str.splitlines breaks at these, Python does not: `# comment<brk>check(y)` is one
    comment line for the compiler, and check(y) would not run."""
    solution = regions.fill(GUARDED, {"body": "    y[:] = x"})
    smuggled = solution.replace("wrote\n    check(y)", f"wrote{brk}    check(y)")
    assert smuggled != solution
    with pytest.raises(Rejected) as info:
        regions.verify(GUARDED, smuggled)
    assert info.value.verdict is Verdict.TAMPERED
    reply = f"```python\n{smuggled}```"
    with pytest.raises(Rejected) as info:
        regions.merge_reply(GUARDED, reply)
    assert info.value.verdict is Verdict.TAMPERED


def test_form_feed_and_lone_carriage_returns_are_lines_as_python_sees_them():
    assert regions._lines("a\fb\u2028c\rd\r\ne\nf") == ["a\fb\u2028c\n", "d\n", "e\n", "f"]
    # a trailing form feed is a blank to Python and C: not a change
    solution = regions.fill(GUARDED, {"body": "    y[:] = x"}).replace("check(y)\n", "check(y)\f\n")
    regions.verify(GUARDED, solution)


# -- a region ends at its end marker -------------------------------------------------------------

@pytest.mark.parametrize("body, needle", [
    ('    _ = """', "inside a string"),  # the fixed text becomes a string
    ("    _ = lambda: (", "open bracket"),  # ... an argument of a lambda never called
])
def test_a_region_that_swallows_the_fixed_text_after_it_is_tampered(body, needle):
    tail = {'    _ = """': '"""', "    _ = lambda: (": ")"}.get(body, "")
    template = GUARDED.replace("check(y)\n", "check(y)\n# >>> COMMBENCH EDIT tail\n"
                               "# <<< COMMBENCH EDIT\n")
    solution = regions.fill(template, {"body": body, "tail": tail})
    with pytest.raises(Rejected) as info:
        regions.verify(template, solution)
    assert info.value.verdict is Verdict.TAMPERED
    assert needle in info.value.message


def test_a_python_region_that_dedents_to_take_the_fixed_text_into_a_block_is_tampered():
    template = GUARDED.replace("    # >>>", "    for _ in range(1):\n        # >>>").replace(
        "    raise", "        raise").replace("    # <<<", "        # <<<").replace(
        "    # the", "        # the").replace("    check", "        check")
    compile(template, "t", "exec")
    solution = regions.fill(template, {"body": "        y[:] = x\n    if False:"})
    compile(solution, "s", "exec")  # valid Python: check(y) is the body of `if False:`
    with pytest.raises(Rejected) as info:
        regions.verify(template, solution)
    assert info.value.verdict is Verdict.TAMPERED
    assert "indented less than its markers" in info.value.message


def test_python_regions_may_hold_any_complete_code():
    body = ('    s = """# <<< COMMBENCH EDIT\n  not the end"""  # (\n'
            "    t = (1,\n2)\n    if s:\n        y[:] = x\n")
    regions.verify(GUARDED, regions.fill(GUARDED, {"body": body}))


C_TEMPLATE = """#include "commbench.h"
#define SCALE 2

extern "C" int commbench_run(const commbench_ctx* ctx) {
  int rc = 0;
  // >>> COMMBENCH EDIT body
  return -1;
  // <<< COMMBENCH EDIT
  rc = commbench_check(ctx);
  // >>> COMMBENCH EDIT tail
  // <<< COMMBENCH EDIT
  return rc;
}
"""


@pytest.mark.parametrize("body, tail, needle", [
    ("  /*", "  */", "inside a comment, a literal or a continued line"),
    ("  // a comment that goes on \\", "", "inside a comment, a literal or a continued line"),
    ('  const char* s = R"x(', '  )x";', "inside a comment, a literal or a continued line"),
    ("#if 0", "#endif", "more #if block(s)"),
    ("  if (0) {", "  }", "more open bracket(s)"),
    ("  return 0;\n}\nstatic int dead(const commbench_ctx* ctx) {\n  int rc;", "",
     "closes a bracket it did not open"),
])
def test_a_c_region_that_swallows_the_fixed_text_after_it_is_tampered(body, tail, needle):
    solution = regions.fill(C_TEMPLATE, {"body": body, "tail": tail})
    with pytest.raises(Rejected) as info:
        regions.verify(C_TEMPLATE, solution)
    assert info.value.verdict is Verdict.TAMPERED
    assert needle in info.value.message


def test_c_regions_may_hold_any_complete_code():
    body = ("  const char* s = \"// >>> } /*\"; char c = '{'; char d = u8'}';\n"
            "  long n = 1'000'000 + 0x1'0p+3; /* { */ // }\n"
            '  const char* r = R"d( } )" // )d";\n'
            "#if SCALE > 1\n  if (n) { rc = (int)(s[0] + c + d + r[0]); }\n#else\n  rc = 1;\n#endif\n"
            "#define OPEN {\n  return rc;")
    regions.verify(C_TEMPLATE, regions.fill(C_TEMPLATE, {"body": body}))


# -- replies that are not usable text ------------------------------------------------------------

def test_a_reply_that_is_not_utf8_text_is_no_solution():
    reply = "# >>> COMMBENCH EDIT body\n    y[:] = x \udcff\n# <<< COMMBENCH EDIT\n"
    with pytest.raises(Rejected) as info:
        regions.merge_reply(TEMPLATE, reply)
    assert info.value.verdict is Verdict.NO_SOLUTION
    assert "not valid UTF-8" in info.value.message


def test_a_huge_reply_is_no_solution_and_costs_little():
    import time

    start = time.monotonic()
    with pytest.raises(Rejected) as info:
        regions.merge_reply(TEMPLATE, "x" * (50 << 20))
    assert info.value.verdict is Verdict.NO_SOLUTION and "characters long" in info.value.message
    # many unclosed fences: one pass, not one per fence
    regions.extract_code("```x\n" * 200_000)
    assert time.monotonic() - start < 5


def test_deeply_nested_replies_are_judged_not_crashed():
    body = "    y[:] = " + "(" * 100_000 + "x" + ")" * 100_000
    solution = regions.merge_reply(TEMPLATE, f"# >>> COMMBENCH EDIT body\n{body}\n"
                                             "# <<< COMMBENCH EDIT\n")
    assert body in solution  # the region check passes it on; the compiler will reject it
    with pytest.raises(Rejected) as info:  # a bracket never closed swallows the fixed text
        regions.merge_reply(TEMPLATE, "# >>> COMMBENCH EDIT body\n    y[:] = " + "[" * 100_000
                            + "\n# <<< COMMBENCH EDIT\n")
    assert info.value.verdict in (Verdict.TAMPERED, Verdict.COMPILE_ERROR)


def test_a_python_region_that_ends_the_file_may_dedent():
    """A region whose end marker is the template's last code (nothing after it but comments
    and blank lines) takes nothing into a block, however it indents: a correct answer that
    closes its function and defines helpers at module level is no tampering."""
    template = ("import numpy as np\n\n\ndef run(ctx, x, y):\n    # >>> COMMBENCH EDIT body\n"
                "    raise NotImplementedError\n    # <<< COMMBENCH EDIT\n\n# the end\n")
    body = "    y[:] = helper(x)\n\n\ndef helper(x):\n    return np.asarray(x) * 2\n"
    solution = regions.fill(template, {"body": body})
    compile(solution, "s", "exec")
    regions.verify(template, solution)  # no Rejected
