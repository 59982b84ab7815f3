/* Keeps the enums of a probe's layout contract (its .h) in the object's BTF,
 * where userspace checks its own values against them (bpf/layout.py). clang
 * describes a type only where something uses it, and these enums index maps
 * and arrays as plain constants. A global function no program calls is
 * described with its arguments' types, and libbpf loads only the functions
 * programs call: it costs no instruction in the kernel. */
#ifndef TRACEHOUND_BTF_KEEP_H
#define TRACEHOUND_BTF_KEEP_H

#define BTF_KEEP(name, ...) \
	__attribute__((used)) int btf_keep_##name(__VA_ARGS__) { return 0; }

#endif
