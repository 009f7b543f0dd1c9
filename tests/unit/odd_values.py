"""Arguments users really pass that are awkward to quote: every generated script must carry
them to the program literally and still pass shellcheck (used by test_render and
test_script_behaviour)."""

ODD_ARGUMENTS = [
    "~/data", "~", "~user/x", "~/a b", "trailing\\", "back\\slash", "\\\\", "it's\\", "\\'", "'\\''",
    "a=b", "--lr=3e-4", "=", "==", "=x", "x,y", ",", "{a,b}", "a*b", "[0]=1", "!x", "a!", "#x", "a#b",
    "%s", "-", "--", "@x", "^x", "x|y", "(x)", "<x", ";", "\t", " ", "é", "\\n", "$", "${x}", "?",
]
