/*
 * port_gid.c: prints GID 0 of port 1 of the first device, as 32 hex digits, for soft-rdma's
 * rdma_core_programs suite (tests/tests/rdma_core_programs.rs), which compares it with the interface's
 * MAC. ibv_devinfo cannot show it: it prints only GIDs whose last eight bytes are not all zero, and an
 * iWARP GID as siw makes it (the MAC, then zeros) has only zeros there.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>

int main(void)
{
	int n = 0, i;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx;
	union ibv_gid gid;

	if (!list || n == 0) {
		printf("port_gid: no device (%s)\n", strerror(errno));
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	if (!ctx) {
		printf("port_gid: ibv_open_device failed (%s)\n", strerror(errno));
		return 1;
	}
	if (ibv_query_gid(ctx, 1, 0, &gid)) {
		printf("port_gid: ibv_query_gid failed (%s)\n", strerror(errno));
		return 1;
	}
	printf("port_gid: ");
	for (i = 0; i < 16; i++)
		printf("%02x", gid.raw[i]);
	printf("\n");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
