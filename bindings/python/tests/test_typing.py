# SPDX-License-Identifier: Apache-2.0
"""The public API carries type hints that resolve, and the package ships
its py.typed marker (PEP 561)."""

import inspect
import os
import sys
import typing
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import kvpage  # noqa: E402
from kvpage import _cache, _lib  # noqa: E402

FUNCTIONS = ["version", "abi_version", "build_info", "device_count", "as_dtype",
             "parse_device", "library", "error_from_code"]
CLASSES = [kvpage.Cache, kvpage.Sequence, kvpage.Decoder, kvpage.Library, kvpage.Ptr,
           kvpage.TorchAllocator]


def public_callables(cls):
    """(name, function) of the methods and property getters users call."""
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__", "__enter__",
                                                 "__exit__", "__len__", "__int__"):
            continue
        if isinstance(member, property):
            yield name, member.fget
        elif inspect.isfunction(member):
            yield name, member


class TypeHintsTest(unittest.TestCase):
    def assert_annotated(self, qualname, fn):
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            self.assertIsNot(p.annotation, p.empty, "%s: parameter %s" % (qualname, p.name))
        self.assertIsNot(sig.return_annotation, sig.empty, "%s: return" % qualname)
        typing.get_type_hints(fn)  # every annotation resolves

    def test_public_api_is_annotated(self):
        for name in FUNCTIONS:
            self.assert_annotated(name, getattr(kvpage, name))
        for cls in CLASSES:
            names = []
            for name, fn in public_callables(cls):
                self.assert_annotated("%s.%s" % (cls.__name__, name), fn)
                names.append(name)
            self.assertIn("__init__", names, cls.__name__)

    def test_hints_name_the_types_returned(self):
        hints = typing.get_type_hints
        self.assertIs(hints(kvpage.Cache.decoder)["return"], kvpage.Decoder)
        self.assertIs(hints(kvpage.Cache.create_sequence)["return"], kvpage.Sequence)
        self.assertIs(hints(kvpage.Sequence.fork)["return"], kvpage.Sequence)
        self.assertIs(hints(kvpage.as_dtype)["return"], kvpage.DType)
        self.assertEqual(hints(kvpage.abi_version)["return"], typing.Tuple[int, int])
        self.assertIs(hints(kvpage.Cache.__init__)["num_blocks"], int)

    def test_layout_tuple_has_every_layout_field(self):
        fields = [f for f, _ in _lib.LayerLayout._fields_ if f != "struct_size"]
        self.assertEqual(list(_cache.LayerLayoutTuple._fields), fields)
        info = [f for f, _ in _lib.CacheInfo._fields_ if f != "struct_size"]
        self.assertEqual(list(_cache.CacheInfoTuple._fields), info)
        self.assertEqual(repr(_cache.WriteStatsTuple(1, 2)),
                         "WriteStats(non_finite=1, saturated=2)")

    def test_py_typed_marker(self):
        pkg = os.path.dirname(kvpage.__file__)
        self.assertTrue(os.path.isfile(os.path.join(pkg, "py.typed")))


if __name__ == "__main__":
    unittest.main()
