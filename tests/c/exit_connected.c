/*
 * exit_connected.c: a short RDMA Write transfer whose programs end their processes with the queue pair
 * still connected: no rdma_disconnect, no ibv_destroy_qp, no rdma_destroy_ep. Written for soft-rdma's metrics
 * suite, which compiles it against the system's rdma-core headers (`cc exit_connected.c -libverbs
 * -lrdmacm`), runs it through `soft-rdma run`, and checks that soft-rdmad's metrics count every byte
 * (docs/metrics.md: the drop-in library reports the queue pairs' counters at exit).
 *
 * Usage:
 *   exit_connected server ADDR PORT LEN   accepts one connection, advertising a LEN-byte region that the
 *                                          peer may write (its address, rkey and length, 16 bytes of private
 *                                          data), waits until the connection ends (its Receive flushes),
 *                                          checks the region holds the client's pattern, and returns.
 *   exit_connected client ADDR PORT       writes the advertised region whole in 1 MiB RDMA Writes, then
 *                                          Reads 8 bytes back (a Read Response follows the Writes before
 *                                          it: RFC 5040 section 5.5, so the Writes have been placed), and
 *                                          returns from main.
 * Lines start with `server: ` or `client: `; the exit code is 0 on success, 1 on a failure (said on stderr).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <endian.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define CHUNK (1u << 20)
#define MAX_CHUNKS 256u

/* What the server advertises (big-endian). */
struct advert {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

static int fail(const char *what)
{
	fprintf(stderr, "%s failed: %s\n", what, strerror(errno));
	return 1;
}

/* Byte i of the transfer. */
static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + i / 4099 + 3);
}

static struct rdma_cm_id *endpoint(const char *addr, const char *port, int passive)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id;

	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_flags = passive ? RAI_PASSIVE : 0;
	if (rdma_getaddrinfo(addr, port, &hints, &res))
		return NULL;
	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = MAX_CHUNKS + 1;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_RC;
	if (rdma_create_ep(&id, res, NULL, &attr))
		id = NULL;
	rdma_freeaddrinfo(res);
	return id;
}

static int server(const char *addr, const char *port, size_t len)
{
	struct rdma_cm_id *listen_id, *id;
	struct rdma_conn_param param;
	struct advert ad;
	struct ibv_wc wc;
	struct ibv_mr *mr, *rmr;
	uint8_t *buf, slot[8];
	size_t i;

	buf = calloc(1, len);
	if (!buf)
		return fail("calloc");
	listen_id = endpoint(addr, port, 1);
	if (!listen_id || rdma_listen(listen_id, 1))
		return fail("listen");
	printf("server: listening\n");
	if (rdma_get_request(listen_id, &id))
		return fail("rdma_get_request");
	/* Written by the client's Writes, read by its last Read. */
	mr = ibv_reg_mr(id->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	rmr = rdma_reg_msgs(id, slot, sizeof(slot));
	if (!mr || !rmr)
		return fail("registering memory");
	/* Its flush tells that the connection ended. */
	if (rdma_post_recv(id, NULL, slot, sizeof(slot), rmr))
		return fail("rdma_post_recv");
	ad.addr = htobe64((uintptr_t)buf);
	ad.rkey = htobe32(mr->rkey);
	ad.len = htobe32((uint32_t)len);
	memset(&param, 0, sizeof(param));
	param.private_data = &ad;
	param.private_data_len = sizeof(ad);
	param.responder_resources = param.initiator_depth = 1;
	if (rdma_accept(id, &param))
		return fail("rdma_accept");
	printf("server: accepted\n");
	if (rdma_get_recv_comp(id, &wc) < 0)
		return fail("rdma_get_recv_comp");
	printf("server: the connection ended (%s)\n", ibv_wc_status_str(wc.status));
	for (i = 0; i < len; i++) {
		if (buf[i] != pattern(i)) {
			fprintf(stderr, "byte %zu is %u, expected %u\n", i, buf[i], pattern(i));
			return 1;
		}
	}
	printf("server: %zu bytes written, all as sent\n", len);
	/* Returns with its queue pair and ids alive. */
	return 0;
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int client(const char *addr, const char *port)
{
	const struct advert *ad;
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	struct timespec t0;
	uint64_t remote;
	uint32_t rkey, len, n, k;
	uint8_t *buf, back[8];
	struct ibv_mr *bmr;
	size_t i;

	id = endpoint(addr, port, 0);
	if (!id || rdma_connect(id, NULL))
		return fail("connect");
	if (!id->event || id->event->param.conn.private_data_len < sizeof(*ad)) {
		fprintf(stderr, "the server advertised no region\n");
		return 1;
	}
	ad = id->event->param.conn.private_data;
	remote = be64toh(ad->addr);
	rkey = be32toh(ad->rkey);
	len = be32toh(ad->len);
	n = (len + CHUNK - 1) / CHUNK;
	if (n == 0 || n > MAX_CHUNKS) {
		fprintf(stderr, "the server advertised %u bytes; 1 to %u MiB work here\n", len, MAX_CHUNKS);
		return 1;
	}
	buf = malloc(len);
	if (!buf)
		return fail("malloc");
	for (i = 0; i < len; i++)
		buf[i] = pattern(i);
	mr = rdma_reg_msgs(id, buf, len);
	bmr = rdma_reg_msgs(id, back, sizeof(back));
	if (!mr || !bmr)
		return fail("registering memory");
	printf("client: connected\n");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (k = 0; k < n; k++) {
		uint32_t at = k * CHUNK, part = len - at < CHUNK ? len - at : CHUNK;

		if (rdma_post_write(id, NULL, buf + at, part, mr, 0, remote + at, rkey))
			return fail("rdma_post_write");
	}
	if (rdma_post_read(id, NULL, back, sizeof(back), bmr, IBV_SEND_SIGNALED, remote, rkey))
		return fail("rdma_post_read");
	if (rdma_get_send_comp(id, &wc) < 0)
		return fail("rdma_get_send_comp");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "the Read completed with %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	printf("client: wrote %u bytes in %.1f ms\n", len, ms_since(&t0));
	/* Returns with the queue pair connected: exit(3) ends the process. */
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "server"))
		return server(argv[2], argv[3], strtoul(argv[4], NULL, 0));
	if (argc == 4 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3]);
	fprintf(stderr, "usage: exit_connected server ADDR PORT LEN | client ADDR PORT\n");
	return 2;
}
