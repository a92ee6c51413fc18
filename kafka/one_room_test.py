"""Keeps librdkafka in one room (issue 33, acceptance 3): outside tests, one source file creates
librdkafka clients (rd_kafka_new, in kafka/client_factory.cc) and only kafka/handles.h destroys
librdkafka handles, so that every handle has one RAII owner.

Run from ctest (kafka_one_room_test) with the source root as its argument. Build trees (a
folder holding CMakeCache.txt), hidden folders and test files (a path containing "_test") are
not counted, as `grep -rn rd_kafka_new --include=*.cc --include=*.h . | grep -v _test` would."""

import os
import re
import sys
import tempfile
import unittest
from typing import Dict, List

SOURCE_SUFFIXES = (".cc", ".h")
FACTORY = os.path.join("kafka", "client_factory.cc")
OWNER = os.path.join("kafka", "handles.h")
# Any librdkafka destructor or free: rd_kafka_destroy, rd_kafka_conf_destroy,
# rd_kafka_message_destroy, rd_kafka_mock_cluster_destroy, rd_kafka_mem_free, ...
DESTROY = re.compile(r"\brd_kafka_\w*(?:destroy|_free)\w*\s*\(")


def source_files(root: str) -> List[str]:
    """Paths relative to `root` of the .cc and .h files that count."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and
                         not os.path.exists(os.path.join(folder, d, "CMakeCache.txt")))
        for name in sorted(files):
            path = os.path.relpath(os.path.join(folder, name), root)
            if name.endswith(SOURCE_SUFFIXES) and "_test" not in path:
                found.append(path)
    return found


def violations(root: str) -> List[str]:
    """What breaks the rule, one line each; empty when the tree keeps it."""
    creators: List[str] = []
    destroyers: Dict[str, List[int]] = {}
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        if any("rd_kafka_new" in line for line in lines):
            creators.append(path)
        if path != OWNER:
            hits = [n + 1 for n, line in enumerate(lines) if DESTROY.search(line)]
            if hits:
                destroyers[path] = hits
    problems = []
    if creators != [FACTORY]:
        problems.append("rd_kafka_new must appear in %s only, appears in: %s" %
                        (FACTORY, ", ".join(creators) or "none"))
    for path, hits in destroyers.items():
        problems.append("%s:%s destroys a librdkafka handle: own it with a type of %s instead" %
                        (path, ",".join(map(str, hits)), OWNER))
    return problems


class OneRoomTest(unittest.TestCase):
    root = ""
    maxDiff = None

    def test_source_tree_keeps_librdkafka_in_one_room(self) -> None:
        self.assertEqual(violations(self.root), [])

    def write(self, root: str, path: str, text: str) -> None:
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)

    def test_finds_a_second_factory_and_a_naked_destroy(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            self.write(root, FACTORY, "rk = rd_kafka_new(type, conf, err, n);\n")
            self.write(root, OWNER, "void f(rd_kafka_t* p) { rd_kafka_destroy(p); }\n")
            self.assertEqual(violations(root), [])
            self.write(root, "ingest/consumer.cc",
                       "x;\nrd_kafka_t* rk = rd_kafka_new(t, c, e, 1);\nrd_kafka_conf_destroy(c);\n")
            self.write(root, "state/log.h", "  rd_kafka_topic_partition_list_destroy (l);\n")
            self.assertEqual(violations(root), [
                "rd_kafka_new must appear in kafka/client_factory.cc only, appears in: "
                "ingest/consumer.cc, kafka/client_factory.cc",
                "ingest/consumer.cc:3 destroys a librdkafka handle: own it with a type of "
                "kafka/handles.h instead",
                "state/log.h:1 destroys a librdkafka handle: own it with a type of "
                "kafka/handles.h instead",
            ])

    def test_skips_tests_build_trees_and_hidden_folders(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            self.write(root, FACTORY, "rd_kafka_new(type, conf, err, n);\n")
            self.write(root, "ingest/consumer_test.cc", "rd_kafka_new(); rd_kafka_destroy(rk);\n")
            self.write(root, "build-asan/CMakeCache.txt", "")
            self.write(root, "build-asan/kafka/client_factory.cc", "rd_kafka_new();\n")
            self.write(root, ".git/x.h", "rd_kafka_new();\n")
            self.assertEqual(violations(root), [])
            os.remove(os.path.join(root, FACTORY))
            self.assertEqual(violations(root), [
                "rd_kafka_new must appear in kafka/client_factory.cc only, appears in: none"])


if __name__ == "__main__":
    OneRoomTest.root = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else ".")
    unittest.main(verbosity=2)
