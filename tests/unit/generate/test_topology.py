import itertools
import random

import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.generate.hostfile import parse_hostfile
from slurmgen.generate.topology import Host, natural_key, order_hosts, rank_table, uniform_table


def check_invariants(table):
    """What every rank table must satisfy, whatever the shape."""
    world = len(table)
    assert [e.rank for e in table] == list(range(world))
    assert all(e.world_size == world for e in table)
    by_node = {}
    for e in table:
        by_node.setdefault(e.node_rank, []).append(e)
    assert sorted(by_node) == list(range(len(by_node)))
    offset = 0
    for node_rank in sorted(by_node):
        members = by_node[node_rank]
        assert len({m.host for m in members}) == 1
        assert [m.local_rank for m in members] == list(range(len(members)))
        assert all(m.local_world_size == len(members) for m in members)
        assert all(m.rank == offset + m.local_rank for m in members)
        assert [m.slot for m in members] == sorted(m.slot for m in members)
        offset += len(members)


# The two tables of the product brief (shared/seeds/002_*.txt, "Rank 分配规则"): the master node
# first, the other nodes in alphabetical order of their names, workers by numeric id.
SEED_TABLES = [
    (
        {"gn6": 1, "gn39": 1, "gn40": 1, "gn7": 1},
        "gn6",
        [("gn6", 0, 0, 0), ("gn39", 1, 0, 1), ("gn40", 2, 0, 2), ("gn7", 3, 0, 3)],
    ),
    ({"gn6": 2, "gn7": 2}, "gn6", [("gn6", 0, 0, 0), ("gn6", 1, 1, 0), ("gn7", 2, 0, 1), ("gn7", 3, 1, 1)]),
]


@pytest.mark.parametrize("slots, master, expected", SEED_TABLES)
def test_the_briefs_tables_in_alphabetical_order(slots, master, expected):
    for given in (list(slots), list(reversed(slots))):  # whatever order the hosts come in
        table = rank_table(
            order_hosts([Host.with_count(n, slots[n]) for n in given], master=master, order="alphabetical")
        )
        assert [(e.host, e.rank, e.local_rank, e.node_rank) for e in table] == expected
        check_invariants(table)


def test_master_first_then_natural_order():
    hosts = [Host.with_count(n, 2) for n in ["gn10", "gn2", "gn7", "gn1"]]
    table = rank_table(order_hosts(hosts, master="gn7", order="natural"))
    assert [(e.host, e.rank, e.local_rank, e.node_rank) for e in table] == [
        ("gn7", 0, 0, 0),
        ("gn7", 1, 1, 0),
        ("gn1", 2, 0, 1),
        ("gn1", 3, 1, 1),
        ("gn2", 4, 0, 2),
        ("gn2", 5, 1, 2),
        ("gn10", 6, 0, 3),
        ("gn10", 7, 1, 3),
    ]


def test_master_defaults_to_first_host_given():
    table = rank_table(order_hosts([Host.with_count("b", 1), Host.with_count("a", 1)]))
    assert [e.host for e in table] == ["b", "a"]


def test_uneven_slots_offset_ranks():
    table = rank_table(order_hosts([Host.with_count("m", 3), Host.with_count("w1", 1), Host.with_count("w2", 2)]))
    assert [(e.host, e.rank, e.local_world_size) for e in table] == [
        ("m", 0, 3),
        ("m", 1, 3),
        ("m", 2, 3),
        ("w1", 3, 1),
        ("w2", 4, 2),
        ("w2", 5, 2),
    ]
    check_invariants(table)


def test_workers_ordered_by_numeric_id():
    table = rank_table([Host("h", (10, 2, 1))])
    assert [(e.slot, e.local_rank) for e in table] == [(1, 0), (2, 1), (10, 2)]


def test_world_size_truncates_and_drops_empty_nodes():
    table = rank_table(order_hosts([Host.with_count("a", 2), Host.with_count("b", 2), Host.with_count("c", 2)]), 3)
    assert [(e.host, e.node_rank, e.local_world_size, e.world_size) for e in table] == [
        ("a", 0, 2, 3),
        ("a", 0, 2, 3),
        ("b", 1, 1, 3),
    ]


def test_world_size_too_large_names_both_numbers():
    with pytest.raises(SlurmgenError) as err:
        rank_table([Host.with_count("a", 2), Host.with_count("b", 2)], 5)
    assert "5" in str(err.value) and "4" in str(err.value)


@pytest.mark.parametrize(
    "hosts, master, words",
    [
        ([Host.with_count("a", 1), Host.with_count("a", 1)], None, "more than once"),
        ([Host.with_count("a", 1)], "zz", "not one of the hosts"),
        ([], None, "no hosts"),
    ],
)
def test_bad_host_sets(hosts, master, words):
    with pytest.raises(SlurmgenError) as err:
        order_hosts(hosts, master)
    assert words in str(err.value)


def test_invariants_over_many_shapes():
    rng = random.Random(7)
    for nodes, per in itertools.product(range(1, 9), range(1, 9)):
        table = uniform_table(nodes, per)
        check_invariants(table)
        assert len(table) == nodes * per
    for _ in range(200):
        hosts = [Host(f"h{i}", tuple(rng.sample(range(16), rng.randint(1, 8)))) for i in range(rng.randint(1, 12))]
        master = rng.choice(hosts).name
        ordered = order_hosts(hosts, master)
        assert ordered[0].name == master
        table = rank_table(ordered, rng.randint(1, sum(len(h.slots) for h in hosts)))
        check_invariants(table)
        assert table[0].host == master


def test_natural_key():
    assert sorted(["n10", "n9", "n1", "m2"], key=natural_key) == ["m2", "n1", "n9", "n10"]


def test_hostfile_deepspeed_format():
    text = "# cluster\nworker-1 slots=4\n\nworker-2 slots=2  # small\nworker-3\n"
    hosts = parse_hostfile(text, default_slots=8)
    assert [(h.name, len(h.slots)) for h in hosts] == [("worker-1", 4), ("worker-2", 2), ("worker-3", 8)]


@pytest.mark.parametrize(
    "text, words",
    [
        ("a slots=0\n", "slots must be"),
        ("a slots=x\n", "slots must be"),
        ("a b c\n", "expected 'HOST slots=N'"),
        ("# only comments\n", "no hosts"),
    ],
)
def test_hostfile_errors_name_the_line(text, words):
    with pytest.raises(SlurmgenError) as err:
        parse_hostfile(text, 1, source="hosts.txt")
    assert words in str(err.value) and "hosts.txt" in str(err.value)
