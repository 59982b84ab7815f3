/* Minimal kernel type declarations for CO-RE.
 *
 * Only the fields tracehound reads are declared; libbpf relocates every access
 * against the running kernel's BTF, so layout and field order here do not
 * matter, only names and types.
 */
#ifndef TRACEHOUND_TYPES_H
#define TRACEHOUND_TYPES_H

#include <linux/types.h>

typedef __u8 u8;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;
typedef __u32 dev_t;
typedef unsigned int fmode_t;
typedef _Bool bool;
#define true 1
#define false 0

#define PRESERVE __attribute__((preserve_access_index))

struct file_system_type {
	const char *name;
} PRESERVE;

/* who owns a mount namespace or a super block: level 0 is the initial user
 * namespace, more is one any user can make (unshare -U) */
struct user_namespace {
	int level;
} PRESERVE;

struct super_block {
	dev_t s_dev;
	struct file_system_type *s_type;
	struct user_namespace *s_user_ns;
} PRESERVE;

struct vfsmount {
	struct super_block *mnt_sb;
} PRESERVE;

struct mnt_namespace;

struct mount {
	struct vfsmount mnt;
	int mnt_id;
	struct mnt_namespace *mnt_ns;
} PRESERVE;

struct dentry {
	struct super_block *d_sb;
} PRESERVE;

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} PRESERVE;

struct file {
	struct path f_path;
	fmode_t f_mode;
} PRESERVE;

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} PRESERVE;

struct files_struct {
	struct fdtable *fdt;
} PRESERVE;

struct fs_struct {
	struct path root;
	struct path pwd;
} PRESERVE;

struct ns_common {
	unsigned int inum;
} PRESERVE;

struct mnt_namespace {
	struct ns_common ns;
	struct user_namespace *user_ns;
} PRESERVE;

struct nsproxy {
	struct mnt_namespace *mnt_ns;
} PRESERVE;

#include "cgroup_types.h"

struct task_struct {
	struct css_set *cgroups;
	struct files_struct *files;
	struct fs_struct *fs;
	struct nsproxy *nsproxy;
} PRESERVE;

struct inode {
	struct super_block *i_sb;
} PRESERVE;

/* Any kernel struct whose member is a struct file pointer: the loader views
 * a slot of the fd array through it (see fd_file). */
struct kiocb {
	struct file *ki_filp;
} PRESERVE;

struct renamedata {
	struct dentry *old_dentry;
} PRESERVE;

/* io_uring's request (io_uring/io_uring_types.h): the submitter is
 * req->task before 6.6, req->tctx->task since */
struct io_uring_task {
	struct task_struct *task;
} PRESERVE;

struct io_cqe {
	__s32 res;
} PRESERVE;

struct io_kiocb {
	struct file *file;
	u8 opcode;
	struct io_cqe cqe;
	struct task_struct *task;
	struct io_uring_task *tctx;
} PRESERVE;

struct address_space {
	struct inode *host;
} PRESERVE;

/* A large folio's page count: _folio_nr_pages before 6.9, _nr_pages since */
struct folio {
	struct address_space *mapping;
	unsigned int _nr_pages;
	unsigned int _folio_nr_pages;
} PRESERVE;

enum pageflags {
	PG_head = 16,    /* relocated: the bit differs between kernels and configs */
};

/* The uapi pt_regs is enough for PT_REGS_PARMn in kprobe programs. */
#include <asm/ptrace.h>

#endif
