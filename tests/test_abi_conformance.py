"""The tracer's own declarations of the libraries it traces (native/src/abi/, issue 17 / F27) agree with the
libraries' real public headers, wherever those are installed (CI has rdma-core's, UCX's, libfabric's; CUDA's
where the toolkit is).

For each ABI header a C file is generated and compiled against the *real* headers only: a static_assert per
size, member offset and member size of every complete struct/union the header declares, per enumerator and
object-like macro value, per typedef size (and signedness for integer types), and a redeclaration of every
typedef without a body and of every function prototype it declares -- a prototype or typedef that differs from
the real one is a compile error.  What the header declares is read from the compiler itself: DWARF of a probe
object (structs, members, enumerators, typedefs), -aux-info (prototypes), and a probe program that prints the
values as our header has them.  The checker is checked too: a copy of a header with a wrong member and a wrong
constant must fail it.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "native" / "src"
CC = shutil.which("gcc")
READELF = shutil.which("readelf")


def _cuda_include():
    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if d and (Path(d) / "include" / "cuda.h").is_file():
            return Path(d) / "include"
    return None


# ABI header -> the real headers it follows; `prefix`: our names carry it (the tracer defines the real
# names itself as its wrappers), the real ones do not; `prototypes`: redeclare our prototypes against the
# real ones (not for CUDA: its prototypes use the driver's enum and handle types, ours their sizes).
LIBS = {
    "verbs.h": dict(real=["infiniband/verbs.h"]),
    "mlx5dv.h": dict(real=["infiniband/mlx5dv.h"]),
    "ucp.h": dict(real=["ucp/api/ucp.h"]),
    "fabric.h": dict(real=["rdma/fabric.h", "rdma/fi_domain.h", "rdma/fi_endpoint.h", "rdma/fi_cm.h",
                           "rdma/fi_eq.h", "rdma/fi_rma.h", "rdma/fi_tagged.h", "rdma/fi_atomic.h",
                           "rdma/fi_errno.h"]),
    "cuda.h": dict(real=["cuda.h"], prefix=("st_", "ST_"), prototypes=False, include=_cuda_include()),
}

needs_tools = pytest.mark.skipif(CC is None or READELF is None, reason="needs gcc and readelf (binutils)")


def _real_flags(lib):
    inc = LIBS[lib].get("include")
    return [f"-I{inc}"] if inc else []


def _have_real(lib):
    """True when every real header of `lib` compiles here."""
    if CC is None:
        return False
    text = "".join(f"#include <{h}>\n" for h in LIBS[lib]["real"])
    r = subprocess.run([CC, "-std=gnu11", "-D_GNU_SOURCE", "-fsyntax-only", *_real_flags(lib), "-x", "c", "-"],
                       input=text, capture_output=True, text=True)
    return r.returncode == 0


# ---------------------------------------------------------------------------------------------------------
# what our header declares, as the compiler sees it

_DIE = re.compile(r"^\s*<(\d+)><([0-9a-f]+)>: Abbrev Number: \d+ \((DW_TAG_\w+)\)")
_ATTR = re.compile(r"^\s*<[0-9a-f]+>\s+(DW_AT_\w+)\s*:\s*(.*)$")


def _dies(obj):
    """The DIE tree of `obj` as a list of dicts {depth, off, tag, attrs, children}."""
    out = subprocess.run([READELF, "--debug-dump=info", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    dies, stack = [], []
    for line in out.splitlines():
        m = _DIE.match(line)
        if m:
            depth = int(m[1])
            die = {"depth": depth, "off": int(m[2], 16), "tag": m[3], "attrs": {}, "children": []}
            while stack and stack[-1]["depth"] >= depth:
                stack.pop()
            if stack:
                stack[-1]["children"].append(die)
            dies.append(die)
            stack.append(die)
            continue
        m = _ATTR.match(line)
        if m and dies:
            val = m[2].strip()
            if "): " in val and val.startswith("("):
                val = val.rsplit("): ", 1)[1]
            dies[-1]["attrs"][m[1]] = val
    return dies


def _our_files(obj, header):
    """DWARF file numbers that name native/src/abi/<header> (the line table's file and directory lists)."""
    out = subprocess.run([READELF, "--wide", "--debug-dump=line", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    dirs, files, section = {}, {}, None
    for line in out.splitlines():
        if "The Directory Table" in line:
            section = "dirs"
        elif "The File Name Table" in line:
            section = "files"
        elif section and line.strip() and line.strip()[0].isdigit():
            # "entry [(form)] [dir] [(form)] (offset: ..): name", the forms shown or not by readelf versions
            numbers = [t for t in re.split(r"\s+", line.split("(offset")[0].strip()) if t.isdigit()]
            name = line.rsplit(": ", 1)[-1].strip()
            if section == "dirs":
                dirs[int(numbers[0])] = name
            else:
                files[int(numbers[0])] = (int(numbers[1]), name)
        elif not line.strip():
            section = None if section == "files" else section
    return {n for n, (d, name) in files.items()
            if Path(name).name == header and (Path(dirs.get(d, "")).name == "abi" or "abi/" in name)}


def _declared(abi_dir, header, tmp):
    """(layouts, enumerators, typedefs, prototypes) of native/src/abi/<header> (or a copy under abi_dir)."""
    probe = tmp / f"probe_{header}.c"
    probe.write_text(f'#include "abi/{header}"\n')
    obj, aux = tmp / f"probe_{header}.o", tmp / f"probe_{header}.aux"
    subprocess.run([CC, "-std=gnu11", "-D_GNU_SOURCE", "-g", "-fno-eliminate-unused-debug-types", f"-I{abi_dir}",
                    f"-I{SRC}", "-aux-info", str(aux), "-c", str(probe), "-o", str(obj)], check=True)
    dies = _dies(obj)
    by_off = {d["off"]: d for d in dies}
    ours = _our_files(obj, header)

    def target(d):
        ref = d["attrs"].get("DW_AT_type", "")
        return by_off.get(int(ref.strip("<>"), 16)) if ref.startswith("<0x") else None

    def members(d, prefix):
        out = []
        for c in d["children"]:
            if c["tag"] != "DW_TAG_member" or "DW_AT_bit_size" in c["attrs"]:
                continue
            t = target(c)
            name = c["attrs"].get("DW_AT_name")
            if name:
                out.append(prefix + name)
            # an anonymous member, or a member of an unnamed struct/union type: its members are reached
            # through it (offsetof(T, a.b))
            if t is not None and t["tag"] in ("DW_TAG_structure_type", "DW_TAG_union_type") \
                    and "DW_AT_name" not in t["attrs"]:
                out += members(t, prefix + (name + "." if name else ""))
        return out

    layouts, enums, typedefs = {}, [], []
    for d in dies:
        if d["depth"] != 1 or int(d["attrs"].get("DW_AT_decl_file", "-1")) not in ours:
            continue
        tag, name = d["tag"], d["attrs"].get("DW_AT_name")
        if tag in ("DW_TAG_structure_type", "DW_TAG_union_type") and name and "DW_AT_byte_size" in d["attrs"]:
            layouts[("struct " if tag == "DW_TAG_structure_type" else "union ") + name] = members(d, "")
        elif tag == "DW_TAG_typedef":
            t = target(d)
            kind = "incomplete" if t is None or "DW_AT_declaration" in t["attrs"] else \
                "integer" if t["tag"] in ("DW_TAG_base_type", "DW_TAG_enumeration_type") else "other"
            if kind == "integer" and t["tag"] == "DW_TAG_base_type" and "float" in t["attrs"].get("DW_AT_encoding", ""):
                kind = "other"
            if t is not None and t["tag"] == "DW_TAG_typedef":   # a typedef of a typedef: its kind
                kind = "other"
            typedefs.append((name, kind))
            if t is not None and t["tag"] in ("DW_TAG_structure_type", "DW_TAG_union_type") \
                    and "DW_AT_name" not in t["attrs"] and "DW_AT_byte_size" in t["attrs"]:
                layouts[name] = members(t, "")
        if tag == "DW_TAG_enumeration_type" or (tag == "DW_TAG_typedef" and target(d) is not None
                                                and target(d)["tag"] == "DW_TAG_enumeration_type"):
            e = d if tag == "DW_TAG_enumeration_type" else target(d)
            enums += [c["attrs"]["DW_AT_name"] for c in e["children"] if c["tag"] == "DW_TAG_enumerator"]
    protos = []
    for line in aux.read_text().splitlines():
        m = re.match(r"/\* (\S+):\d+:\w+ \*/ extern (.*?)\b(\w+) \((.*)\);", line)
        if m and Path(m[1]).name == header and Path(m[1]).parent.name == "abi":
            protos.append((m[2], m[3], m[4]))
    return layouts, sorted(set(enums)), typedefs, protos


def _macros(abi_dir, header):
    """Object-like macros of the header with a value (not the include guard, not the ST_ABI_*_FROM string)."""
    text = (Path(abi_dir) / "abi" / header).read_text()
    out = []
    for m in re.finditer(r"^#define (\w+)[ \t]+(.+)$", text, re.M):
        if m[1].endswith("_FROM") or m[2].lstrip().startswith('"'):
            continue
        out.append(m[1])
    return out


def _bodiless_typedefs(abi_dir, header):
    text = re.sub(r"/\*.*?\*/", " ", (Path(abi_dir) / "abi" / header).read_text(), flags=re.S)
    return [" ".join(t.split()) for t in re.findall(r"\btypedef\b[^;{}]*;", text)]


def _ours_values(abi_dir, header, tmp, layouts, enums, macros, typedefs):
    """Sizes, offsets, values and signedness as our header has them (a probe program prints them)."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "abi/{header}"', "int main(void) {"]
    for t, mems in layouts.items():
        lines.append(f'printf("S|{t}|%zu\\n", sizeof({t}));')
        for m in mems:
            lines.append(f'printf("M|{t}|{m}|%zu|%zu\\n", offsetof({t}, {m}), sizeof((({t} *)0)->{m}));')
    for n in enums + macros:
        lines.append(f'printf("V|{n}|%lld\\n", (long long)({n}));')
    for t, kind in typedefs:
        if kind == "incomplete":       # a handle's struct: only pointers to it exist
            continue
        signed = f"(int)(({t})-1 < ({t})0)" if kind == "integer" else "-1"
        lines.append(f'printf("T|{t}|%zu|%d\\n", sizeof({t}), {signed});')
    lines.append("return 0; }")
    src, exe = tmp / f"values_{header}.c", tmp / f"values_{header}"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([CC, "-std=gnu11", "-D_GNU_SOURCE", "-w", f"-I{abi_dir}", f"-I{SRC}", str(src), "-o", str(exe)],
                   check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()


def _real(name, prefix):
    for p in prefix:
        if name.startswith(p):
            return name[len(p):]
    return name


def conformance_source(header, tmp, abi_dir=SRC):
    """The C file of static_asserts of our declarations against the real headers, and how many checks."""
    lib = LIBS[header]
    prefix = lib.get("prefix", ())
    layouts, enums, typedefs, protos = _declared(abi_dir, header, tmp)
    macros = _macros(abi_dir, header)
    vals = _ours_values(abi_dir, header, tmp, layouts, enums, macros, typedefs)
    out = ["#include <stddef.h>", "#include <stdint.h>", *[f"#include <{h}>" for h in lib["real"]],
           f"/* generated by tests/test_abi_conformance.py from native/src/abi/{header} */"]
    n = 0
    for v in vals:
        kind, *f = v.split("|")
        if kind == "S":
            t = _real(f[0].split()[-1], prefix)
            t = f"{f[0].split()[0]} {t}" if " " in f[0] else t
            out.append(f'_Static_assert(sizeof({t}) == {f[1]}, "sizeof({t}) is {f[1]} in abi/{header}");')
        elif kind == "M":
            t = f"{f[0].split()[0]} {_real(f[0].split()[-1], prefix)}" if " " in f[0] else _real(f[0], prefix)
            out.append(f'_Static_assert(offsetof({t}, {f[1]}) == {f[2]}, '
                       f'"offsetof({t}, {f[1]}) is {f[2]} in abi/{header}");')
            out.append(f'_Static_assert(sizeof((({t} *)0)->{f[1]}) == {f[3]}, '
                       f'"sizeof({t}.{f[1]}) is {f[3]} in abi/{header}");')
            n += 1
        elif kind == "V":
            r = _real(f[0], prefix)
            out.append(f'_Static_assert((long long)({r}) == {f[1]}LL, "{r} is {f[1]} in abi/{header}");')
        elif kind == "T":
            r = _real(f[0], prefix)
            if r.startswith("st_"):          # a name of ours only (st_ibv_unused_fn): nothing to compare
                continue
            out.append(f'_Static_assert(sizeof({r}) == {f[1]}, "sizeof({r}) is {f[1]} in abi/{header}");')
            if f[2] != "-1":
                out.append(f'_Static_assert((({r})-1 < ({r})0) == {f[2]}, '
                           f'"{r} is {"signed" if f[2] == "1" else "unsigned"} in abi/{header}");')
        n += 1
    if not prefix:
        for t in _bodiless_typedefs(abi_dir, header):   # a different type is a conflicting redefinition
            out.append(t)
            n += 1
    if lib.get("prototypes", True):
        for ret, name, params in protos:  # (name): not expanded by a function-like macro of the same name
            out.append(f"extern {ret}({name})({params});")
            n += 1
    return "\n".join(out) + "\n", n


def check(header, tmp, abi_dir=SRC):
    """(compiler errors, number of checks) of our header against the real ones."""
    src, n = conformance_source(header, tmp, abi_dir)
    path = tmp / f"conformance_{header}.c"
    path.write_text(src)
    r = subprocess.run([CC, "-std=gnu11", "-D_GNU_SOURCE", "-fsyntax-only", "-fmax-errors=0",
                        *_real_flags(header), str(path)], capture_output=True, text=True)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    return errors, n


# ---------------------------------------------------------------------------------------------------------

@needs_tools
@pytest.mark.parametrize("header", sorted(LIBS))
def test_abi_declarations_match_the_real_headers(tmp_path, header):
    if not _have_real(header):
        pytest.skip(f"the real headers of abi/{header} ({', '.join(LIBS[header]['real'])}) are not installed here")
    errors, n = check(header, tmp_path)
    assert not errors, f"abi/{header} differs from {LIBS[header]['real']}:\n" + "\n".join(errors[:60])
    assert n >= 10, f"only {n} checks generated for abi/{header}: the checker found almost nothing"


def test_every_abi_header_is_checked():
    """A new header in native/src/abi/ gets a LIBS entry (the real headers it follows)."""
    assert sorted(p.name for p in (SRC / "abi").glob("*.h")) == sorted(LIBS)


@needs_tools
@pytest.mark.skipif(not _have_real("verbs.h"), reason="rdma-core headers (libibverbs-dev) not installed")
def test_the_checker_catches_a_wrong_declaration(tmp_path):
    """A copy of abi/verbs.h with a member of the wrong width (ibv_wc.qp_num), a wrong enumerator, a prototype with a wrong
    parameter and a table slot moved fails the check at each of them."""
    text = (SRC / "abi" / "verbs.h").read_text()
    bad = text.replace("\tuint32_t qp_num;\n", "\tuint64_t qp_num;\n", 1) \
              .replace("IBV_QP_DEST_QPN = 1 << 20", "IBV_QP_DEST_QPN = 1 << 21", 1) \
              .replace("int ibv_destroy_qp(struct ibv_qp *qp);", "int ibv_destroy_qp(struct ibv_qp *qp, int x);", 1) \
              .replace("\tint (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);\n"
                       "\tint (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);\n",
                       "\tint (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);\n"
                       "\tint (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);\n", 1)
    assert bad.count("uint64_t qp_num") == 1 and "1 << 21" in bad and "int x)" in bad
    (tmp_path / "abi").mkdir()
    (tmp_path / "abi" / "verbs.h").write_text(bad)
    errors, _ = check("verbs.h", tmp_path, abi_dir=tmp_path)
    text = "\n".join(errors)
    assert "sizeof(struct ibv_wc.qp_num) is 8" in text and "offsetof(struct ibv_wc, src_qp)" in text, text
    assert "IBV_QP_DEST_QPN" in text, text
    assert "ibv_destroy_qp" in text, text
    assert "offsetof(struct ibv_context_ops, post_send)" in text, text
