import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.generate.hostlist import expand


@pytest.mark.parametrize(
    "expr, hosts",
    [
        ("node1", ["node1"]),
        ("gn6,gn7", ["gn6", "gn7"]),
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("rack[1,3]-gpu[9-10],login", ["rack1-gpu9", "rack1-gpu10", "rack3-gpu9", "rack3-gpu10", "login"]),
        (" a , b ", ["a", "b"]),
        ("x[5]", ["x5"]),
    ],
)
def test_expand(expr, hosts):
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    "expr, words",
    [
        ("", "empty"),
        ("gpu[01-03", "unmatched '['"),
        ("gpu01]", "unmatched ']'"),
        ("gpu[3-1]", "backwards"),
        ("gpu[a-b]", "bad range"),
        ("gpu[[1]]", "nested"),
        ("a,,b", "empty host name"),
        ("gpu[1-]", "bad range"),
    ],
)
def test_bad_expressions_name_the_problem(expr, words):
    with pytest.raises(SlurmgenError) as err:
        expand(expr)
    assert words in str(err.value)
