"""Write and compile serve_app's protobuf schema.

Two steps, both deterministic:

* ``--derive``: print ``model_config.proto`` and ``grpc_service.proto`` from the
  descriptors that the installed ``tritonclient`` ships, under Triton's proto
  package (``inference``), so that stubs any gRPC stack generates from them reach
  the server.  Field names, numbers, types and labels are Triton's.
* default: compile the ``.proto`` files in ``serve_app/protos`` with
  ``grpc_tools.protoc`` into ``*_pb2.py`` / ``*_pb2.pyi`` next to them, registered
  in serve_app's own descriptor pool (``serve_app.protos.pool``): tritonclient
  puts the same ``inference.*`` symbols in the default pool, and both must load
  in one process.

``tests/unit/test_protos.py`` checks that the checked-in modules are current and
that every message matches tritonclient's field for field.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

from google.protobuf import descriptor_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "serve_app" / "protos"
PACKAGE = "inference"
FILES = ("model_config.proto", "grpc_service.proto")

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}

HEADER = """// serve_app's copy of the Triton {what}.
// Package, field names and numbers are Triton's, so that stubs generated from
// this file by any gRPC stack reach serve_app and Triton alike.  Regenerate the
// Python modules with `python -m scripts.gen_protos` after editing.
"""

_DEFAULT_POOL = "_descriptor_pool.Default()"
_OWN_POOL = "_pool.POOL"
_POOL_IMPORT = "from serve_app.protos import pool as _pool\n"


class _Printer:
    def __init__(self, source_package: str) -> None:
        self.lines: list[str] = []
        self.src = source_package

    def type_name(self, name: str) -> str:
        prefix = "." + self.src + "."
        return name[len(prefix) :] if name.startswith(prefix) else name.lstrip(".")

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text if text else "")

    def enum(self, e: descriptor_pb2.EnumDescriptorProto, depth: int) -> None:
        self.emit(depth, f"enum {e.name} {{")
        if e.options.allow_alias:
            self.emit(depth + 1, "option allow_alias = true;")
        for v in e.value:
            self.emit(depth + 1, f"{v.name} = {v.number};")
        self.emit(depth, "}")

    def field_type(
        self, f: descriptor_pb2.FieldDescriptorProto, maps: dict[str, descriptor_pb2.DescriptorProto]
    ) -> str:
        if f.type in (f.TYPE_MESSAGE, f.TYPE_ENUM):
            entry = maps.get(f.type_name)
            if entry is not None:
                k, v = entry.field[0], entry.field[1]
                return f"map<{self.field_type(k, maps)}, {self.field_type(v, maps)}>"
            return self.type_name(f.type_name)
        return _SCALARS[f.type]

    def message(self, m: descriptor_pb2.DescriptorProto, depth: int, scope: str) -> None:
        full = f"{scope}.{m.name}"
        maps = {f"{full}.{n.name}": n for n in m.nested_type if n.options.map_entry}
        self.emit(depth, f"message {m.name} {{")
        for e in m.enum_type:
            self.enum(e, depth + 1)
        for n in m.nested_type:
            if not n.options.map_entry:
                self.message(n, depth + 1, full)
        oneofs: dict[int, list[descriptor_pb2.FieldDescriptorProto]] = {}
        plain: list[descriptor_pb2.FieldDescriptorProto] = []
        for f in m.field:
            if f.HasField("oneof_index") and not f.proto3_optional:
                oneofs.setdefault(f.oneof_index, []).append(f)
            else:
                plain.append(f)
        emitted_oneofs: set[int] = set()
        for f in m.field:
            if f.HasField("oneof_index") and not f.proto3_optional:
                idx = f.oneof_index
                if idx in emitted_oneofs:
                    continue
                emitted_oneofs.add(idx)
                self.emit(depth + 1, f"oneof {m.oneof_decl[idx].name} {{")
                for of in oneofs[idx]:
                    self.emit(depth + 2, f"{self.field_type(of, maps)} {of.name} = {of.number};")
                self.emit(depth + 1, "}")
                continue
            label = ""
            is_map = f.type_name in maps
            if f.label == f.LABEL_REPEATED and not is_map:
                label = "repeated "
            elif f.proto3_optional:
                label = "optional "
            self.emit(depth + 1, f"{label}{self.field_type(f, maps)} {f.name} = {f.number};")
        for r in m.reserved_range:
            self.emit(depth + 1, f"reserved {r.start} to {r.end - 1};")
        if m.reserved_name:
            names = ", ".join(f'"{n}"' for n in m.reserved_name)
            self.emit(depth + 1, f"reserved {names};")
        self.emit(depth, "}")

    def service(self, s: descriptor_pb2.ServiceDescriptorProto) -> None:
        self.emit(0, f"service {s.name} {{")
        for meth in s.method:
            cs = "stream " if meth.client_streaming else ""
            ss = "stream " if meth.server_streaming else ""
            self.emit(
                1,
                f"rpc {meth.name}({cs}{self.type_name(meth.input_type)}) returns "
                f"({ss}{self.type_name(meth.output_type)}) {{}}",
            )
        self.emit(0, "}")


def derive() -> None:
    """Print our .proto files from tritonclient's descriptors."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    sources = {"model_config.proto": model_config_pb2, "grpc_service.proto": service_pb2}
    whats = {"model_config.proto": "model configuration schema", "grpc_service.proto": "KServe v2 gRPC service"}
    for out_name, module in sources.items():
        fdp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fdp)
        p = _Printer(fdp.package)
        p.lines.append(HEADER.format(what=whats[out_name]).rstrip("\n"))
        p.emit(0, "")
        p.emit(0, 'syntax = "proto3";')
        p.emit(0, "")
        p.emit(0, f"package {PACKAGE};")
        p.emit(0, "")
        for dep in fdp.dependency:
            p.emit(0, f'import "serve_app/protos/{dep}";')
        if fdp.dependency:
            p.emit(0, "")
        for e in fdp.enum_type:
            p.enum(e, 0)
            p.emit(0, "")
        for m in fdp.message_type:
            p.message(m, 0, "." + fdp.package)
            p.emit(0, "")
        for s in fdp.service:
            p.service(s)
            p.emit(0, "")
        text = "\n".join(p.lines).rstrip("\n") + "\n"
        (PROTO_DIR / out_name).write_text(text)
        print(f"wrote {PROTO_DIR / out_name}")


def compile_to(out_dir: pathlib.Path) -> None:
    """Compile our .proto files into ``out_dir/serve_app/protos``."""
    import grpc_tools
    from grpc_tools import protoc

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for name in FILES:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            str(PROTO_DIR / name),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {name}")
        _use_own_pool(out_dir / "serve_app" / "protos" / name.replace(".proto", "_pb2.py"))


def _use_own_pool(module: pathlib.Path) -> None:
    """Register the generated module's file in serve_app's pool instead of the default one."""
    text = module.read_text()
    if _DEFAULT_POOL not in text:
        raise SystemExit(f"{module.name}: protoc's output no longer calls {_DEFAULT_POOL}")
    marker = "# @@protoc_insertion_point(imports)\n"
    text = text.replace(_DEFAULT_POOL, _OWN_POOL).replace(marker, marker + "\n" + _POOL_IMPORT)
    module.write_text(text)


def generate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        compile_to(pathlib.Path(tmp))
        for path in (pathlib.Path(tmp) / "serve_app" / "protos").iterdir():
            shutil.copy(path, PROTO_DIR / path.name)
            print(f"wrote {PROTO_DIR / path.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--derive", action="store_true", help="re-derive the .proto files from tritonclient first")
    args = parser.parse_args(argv)
    if args.derive:
        derive()
    generate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
