/* libibverbs.so.1 of the emulated HCA: the device's sysfs identity.
 *
 * Libraries look past the verbs API at the device's sysfs files: UCX takes
 * realpath(ibv_device.ibdev_path), strips two components to reach the PCI
 * function and reads its vendor/device ids there (a ConnectX id is what makes
 * it offer rc_mlx5/ud_mlx5), plus link width/speed, numa_node and local_cpus;
 * Open MPI and NVSHMEM read /sys/class/infiniband/<dev>/device/...  The
 * emulator never touches the machine's /sys: it writes a small tree of its
 * own, shaped like the kernel's, under /dev/shm
 *
 *   /dev/shm/sigmatrace-emu.<fabric>.<lid>.sys/
 *     devices/pci0000:00/0000:<bus>:00.0/{vendor,device,numa_node,local_cpus,...}
 *       infiniband/<dev>/{node_guid,fw_ver,ports/1/...,device -> ../..}
 *       infiniband_verbs/uverbs0/{ibdev,dev,abi_version,device -> ../..}
 *       driver -> ../../../bus/pci/drivers/mlx5_core
 *     class/infiniband/<dev>       -> ../../devices/.../infiniband/<dev>
 *     class/infiniband_verbs/uverbs0 -> ../../devices/.../infiniband_verbs/uverbs0
 *
 * and reports ibdev_path/dev_path inside it.  st-emu-ns (a private mount
 * namespace, docs/emulator.md) links /sys/class/infiniband/<dev> to the same
 * tree and adds /dev/infiniband/uverbs0; inside such a namespace the device
 * reports rdma-core's own paths.  The tree is removed when the process that
 * wrote it exits (tests also remove their fabric's files). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu_internal.h"

/* The root is /dev/shm/sigmatrace-emu.<fabric of <= 63 chars>.<lid>.sys, so
 * every path below it fits PATH_MAX by far: truncation cannot happen. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static char g_root[PATH_MAX];
static pid_t g_root_pid;

static int put(const char *dir, const char *name, const char *fmt, ...)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	ssize_t w = write(fd, buf, n > 0 ? (size_t)n : 0);
	close(fd);
	return w == n ? 0 : -1;
}

static int mkdirs(const char *path)
{
	char p[PATH_MAX];
	snprintf(p, sizeof p, "%s", path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0755) && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	remove(path);
	return 0;
}

static void rm_tree(const char *root)
{
	nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void sysfs_atexit(void)
{
	if (g_root[0] && g_root_pid == getpid())
		rm_tree(g_root);
}

/* "0002:c903:0000:0001" */
static void guid_text(char *out, size_t n, uint64_t g)
{
	snprintf(out, n, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff, (unsigned)(g >> 32) & 0xffff,
		 (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
}

static int write_tree(const struct emu_nic *cfg, const char *root, const char *bdf)
{
	char pci[PATH_MAX], ib[PATH_MAX], port[PATH_MAX], uv[PATH_MAX], d[PATH_MAX], t[64];
	snprintf(pci, sizeof pci, "%s/devices/pci0000:00/%s", root, bdf);
	snprintf(ib, sizeof ib, "%s/infiniband/%s", pci, cfg->dev_name);
	snprintf(port, sizeof port, "%s/ports/1", ib);
	snprintf(uv, sizeof uv, "%s/infiniband_verbs/uverbs0", pci);
	int err = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	if (ncpu < 1)
		ncpu = 1;
	/* the PCI function (UCX: uct_ib_device_set_pci_id, _set_pci_bw, _get_locality) */
	err |= mkdirs(pci);
	err |= put(pci, "vendor", "0x15b3\n");     /* Mellanox */
	err |= put(pci, "device", "0x101b\n");     /* 4123: ConnectX-6 */
	err |= put(pci, "subsystem_vendor", "0x15b3\n");
	err |= put(pci, "subsystem_device", "0x0007\n");
	err |= put(pci, "class", "0x020700\n");    /* network, InfiniBand */
	err |= put(pci, "revision", "0x00\n");
	err |= put(pci, "numa_node", "-1\n");
	err |= put(pci, "current_link_speed", "16.0 GT/s PCIe\n");
	err |= put(pci, "current_link_width", "16\n");
	err |= put(pci, "max_link_speed", "16.0 GT/s PCIe\n");
	err |= put(pci, "max_link_width", "16\n");
	{
		/* local_cpus: comma-separated 32-bit hex words, most significant first */
		char mask[1024] = "";
		int words = (int)((ncpu + 31) / 32);
		for (int w = words - 1; w >= 0; w--) {
			long bits = ncpu - 32L * w;
			uint32_t v = bits >= 32 ? 0xffffffffu : (uint32_t)((1ull << bits) - 1);
			size_t l = strlen(mask);
			snprintf(mask + l, sizeof mask - l, w ? "%08x," : "%08x", v);
		}
		err |= put(pci, "local_cpus", "%s\n", mask);
		err |= put(pci, "local_cpulist", ncpu > 1 ? "0-%ld\n" : "0\n", ncpu - 1);
	}
	snprintf(d, sizeof d, "%s/bus/pci/drivers/mlx5_core", root);
	err |= mkdirs(d);
	snprintf(d, sizeof d, "%s/driver", pci);
	err |= symlink("../../../bus/pci/drivers/mlx5_core", d) && errno != EEXIST;

	/* the IB device (rdma-core's ibdev_path) */
	err |= mkdirs(port);
	guid_text(t, sizeof t, cfg->guid);
	err |= put(ib, "node_guid", "%s\n", t);
	err |= put(ib, "sys_image_guid", "%s\n", t);
	err |= put(ib, "node_type", "1: CA\n");
	err |= put(ib, "node_desc", "sigmatrace-emu %s\n", cfg->dev_name);
	err |= put(ib, "fw_ver", "16.99.9999\n");
	err |= put(ib, "hca_type", "MT4123\n");
	err |= put(ib, "hw_rev", "0x0\n");
	err |= put(ib, "board_id", "SIGMATRACE_EMU\n");
	snprintf(d, sizeof d, "%s/device", ib);
	err |= symlink("../..", d) && errno != EEXIST;
	err |= put(port, "lid", "0x%x\n", cfg->lid);
	err |= put(port, "lid_mask_count", "0\n");
	err |= put(port, "sm_lid", "0x1\n");
	err |= put(port, "sm_sl", "0\n");
	err |= put(port, "state", "4: ACTIVE\n");
	err |= put(port, "phys_state", "5: LinkUp\n");
	err |= put(port, "rate", "100 Gb/sec (4X EDR)\n");
	err |= put(port, "cap_mask", "0x02514868\n");
	err |= put(port, "link_layer", "InfiniBand\n");
	snprintf(d, sizeof d, "%s/gids", port);
	err |= mkdirs(d);
	const uint8_t *g = cfg->gid;
	err |= put(d, "0", "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x\n", g[0], g[1], g[2],
		   g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]);
	snprintf(d, sizeof d, "%s/pkeys", port);
	err |= mkdirs(d);
	err |= put(d, "0", "0xffff\n");
	snprintf(d, sizeof d, "%s/gid_attrs/types", port);
	err |= mkdirs(d);
	err |= put(d, "0", "IB/RoCE v1\n");

	/* the verbs character device's class entry (rdma-core's dev_path) */
	err |= mkdirs(uv);
	err |= put(uv, "ibdev", "%s\n", cfg->dev_name);
	err |= put(uv, "abi_version", "1\n");
	err |= put(uv, "dev", "231:192\n");
	snprintf(d, sizeof d, "%s/device", uv);
	err |= symlink("../..", d) && errno != EEXIST;

	/* class views */
	snprintf(d, sizeof d, "%s/class/infiniband", root);
	err |= mkdirs(d);
	snprintf(d, sizeof d, "%s/class/infiniband/%s", root, cfg->dev_name);
	char target[PATH_MAX];
	snprintf(target, sizeof target, "../../devices/pci0000:00/%s/infiniband/%s", bdf, cfg->dev_name);
	err |= symlink(target, d) && errno != EEXIST;
	snprintf(d, sizeof d, "%s/class/infiniband_verbs", root);
	err |= mkdirs(d);
	err |= put(d, "abi_version", "6\n");
	snprintf(d, sizeof d, "%s/class/infiniband_verbs/uverbs0", root);
	snprintf(target, sizeof target, "../../devices/pci0000:00/%s/infiniband_verbs/uverbs0", bdf);
	err |= symlink(target, d) && errno != EEXIST;
	return err ? -1 : 0;
}

/* Paths for the ibv_device: rdma-core's own when st-emu-ns made
 * /sys/class/infiniband/<dev> this tree, else the tree's.  The tree is
 * written once per process; without it the paths stay rdma-core's (UCX then
 * finds no PCI identity and offers only the verbs transports). */
EXPORT void emu_sysfs_paths(char *ibdev_path, size_t n1, char *dev_path, size_t n2)
{
	const struct emu_nic *cfg = emu_config();
	const char *name = cfg ? cfg->dev_name : "mlx5_0";
	snprintf(ibdev_path, n1, "/sys/class/infiniband/%s", name);
	snprintf(dev_path, n2, "/sys/class/infiniband_verbs/uverbs0");
	if (!cfg)
		return;
	if (!g_root[0] || g_root_pid != getpid()) {
		char root[PATH_MAX], bdf[32];
		snprintf(root, sizeof root, "/dev/shm/sigmatrace-emu.%s.%u.sys", cfg->fabric, cfg->lid);
		snprintf(bdf, sizeof bdf, "0000:%02x:00.0", 0x80 | (cfg->lid & 0x7f));
		rm_tree(root); /* a dead process's tree with our LID */
		if (write_tree(cfg, root, bdf)) {
			EMU_LOG("sysfs tree %s not written: %s", root, strerror(errno));
			rm_tree(root);
			return;
		}
		static int atexit_done;
		if (!atexit_done++)
			atexit(sysfs_atexit);
		snprintf(g_root, sizeof g_root, "%s", root);
		g_root_pid = getpid();
	}
	char mine[PATH_MAX], there[PATH_MAX], std[PATH_MAX];
	snprintf(mine, sizeof mine, "%s/class/infiniband/%s", g_root, name);
	snprintf(std, sizeof std, "/sys/class/infiniband/%s", name);
	char *a = realpath(mine, NULL), *b = realpath(std, there);
	int same = a && b && !strcmp(a, b);
	free(a);
	if (same)
		return; /* inside st-emu-ns: rdma-core's paths lead to the tree */
	snprintf(ibdev_path, n1, "%s", mine);
	snprintf(dev_path, n2, "%s/class/infiniband_verbs/uverbs0", g_root);
}
