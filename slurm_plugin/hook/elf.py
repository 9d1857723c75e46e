"""What the guard reads from a job_submit plugin: its dynamic symbols and DT_NEEDED list.

Only ELF64 little-endian shared objects with section headers (what gcc builds for x86_64
and aarch64 Linux); anything else raises :class:`NotASharedObject`.  The layouts are the
System V ABI's (``Elf64_Ehdr``, ``Elf64_Shdr``, ``Elf64_Sym``, ``Elf64_Dyn``, see elf(5)).
Parsing works on bytes; nothing here opens a file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
_ET_DYN = 3
_SHT_DYNAMIC = 6
_SHT_NOBITS = 8
_SHT_DYNSYM = 11
_SHN_UNDEF = 0
_SHN_LORESERVE = 0xFF00
_DT_NULL = 0
_DT_NEEDED = 1


class NotASharedObject(ValueError):
    """The bytes are not an ELF64 little-endian shared object this reader understands."""


@dataclass(frozen=True, slots=True)
class ElfSymbol:
    """A defined dynamic symbol whose bytes are in the file."""

    name: str
    file_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class SharedObject:
    needed: tuple[str, ...]
    """The DT_NEEDED entries, in order (``libpython3.11.so.1.0``, ``libc.so.6``, ...)."""
    symbols: dict[str, ElfSymbol]
    """Defined dynamic symbols that live in a file-backed section, by name."""

    def u32(self, data: bytes, name: str) -> int:
        """The uint32 value of symbol ``name`` (``plugin_version``) in ``data``."""
        sym = self._symbol(name, 4)
        return struct.unpack_from("<I", data, sym.file_offset)[0]

    def with_u32(self, data: bytes, name: str, value: int) -> bytes:
        """``data`` with symbol ``name`` set to the uint32 ``value``."""
        sym = self._symbol(name, 4)
        return _splice(data, sym.file_offset, struct.pack("<I", value))

    def with_text(self, data: bytes, name: str, text: str) -> bytes:
        """``data`` with the char array ``name`` holding ``text`` (UTF-8, NUL-padded;
        cut to fit, a NUL always last)."""
        sym = self._symbol(name, 1)
        raw = text.encode()[: sym.size_bytes - 1]
        return _splice(data, sym.file_offset, raw.ljust(sym.size_bytes, b"\0"))

    def _symbol(self, name: str, min_size_bytes: int) -> ElfSymbol:
        sym = self.symbols.get(name)
        if sym is None:
            raise NotASharedObject(f"no symbol {name} in the file")
        if sym.size_bytes < min_size_bytes:
            raise NotASharedObject(f"symbol {name} is {sym.size_bytes} bytes")
        return sym


def _splice(data: bytes, offset: int, chunk: bytes) -> bytes:
    return data[:offset] + chunk + data[offset + len(chunk) :]


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise NotASharedObject("a name points outside its string table")
    return table[offset:end].decode(errors="replace")


def parse(data: bytes) -> SharedObject:
    """The DT_NEEDED list and defined, file-backed dynamic symbols of a shared object."""
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise NotASharedObject("not an ELF file")
    ident, e_type, *_, e_shoff, _flags, _ehsize, _phentsize, _phnum, shentsize, shnum, _ = (
        _EHDR.unpack_from(data)
    )
    if ident[4] != 2 or ident[5] != 1:
        raise NotASharedObject("not a 64-bit little-endian ELF file")
    if e_type != _ET_DYN:
        raise NotASharedObject("not a shared object")
    if not e_shoff or shentsize != _SHDR.size or e_shoff + shnum * shentsize > len(data):
        raise NotASharedObject("no section headers")
    sections = [_SHDR.unpack_from(data, e_shoff + i * shentsize) for i in range(shnum)]

    def body(index: int) -> bytes:
        if index >= len(sections):
            raise NotASharedObject("a section links to a missing section")
        _n, sh_type, _f, _a, offset, size, *_ = sections[index]
        if sh_type == _SHT_NOBITS or offset + size > len(data):
            raise NotASharedObject("a section lies outside the file")
        return data[offset : offset + size]

    needed: list[str] = []
    symbols: dict[str, ElfSymbol] = {}
    for index, (_n, sh_type, _f, _a, _o, _s, sh_link, _i, _al, entsize) in enumerate(sections):
        if sh_type == _SHT_DYNAMIC:
            strings, table = body(sh_link), body(index)
            for off in range(0, len(table) - _DYN.size + 1, _DYN.size):
                tag, value = _DYN.unpack_from(table, off)
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    needed.append(_cstr(strings, value))
        elif sh_type == _SHT_DYNSYM and entsize == _SYM.size:
            strings, table = body(sh_link), body(index)
            # Entry 0 is the reserved null symbol.
            for off in range(_SYM.size, len(table) - _SYM.size + 1, _SYM.size):
                st_name, _info, _other, shndx, value, size = _SYM.unpack_from(table, off)
                if shndx == _SHN_UNDEF or shndx >= min(_SHN_LORESERVE, len(sections)):
                    continue
                _sn, home_type, _sf, home_addr, home_offset, home_size, *_ = sections[shndx]
                if home_type == _SHT_NOBITS or not home_addr <= value < home_addr + home_size:
                    continue
                file_offset = home_offset + value - home_addr
                if file_offset + size > len(data):
                    raise NotASharedObject("a symbol lies outside the file")
                name = _cstr(strings, st_name)
                symbols[name] = ElfSymbol(name, file_offset, size)
    return SharedObject(tuple(needed), symbols)
