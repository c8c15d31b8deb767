/*
 * sync_cm.c: synchronous rdma_cm ids (rdma_create_ep without an event channel) and the forms of
 * rdma_getaddrinfo's hints, as rdma-core's librdmacm behaves (librdmacm/cma.c `ucma_complete`,
 * librdmacm/addrinfo.c). Written for soft-rdma's rdma_core_programs suite, which compiles it against the
 * system's rdma-core headers (`cc sync_cm.c -libverbs -lrdmacm`) and runs it through `soft-rdma run`.
 *
 * Usage: sync_cm CASE ADDR PORT. Each case prints lines `CASE: what happened` for the Rust test.
 *
 *   getaddrinfo  the hints forms: node and service (passive, active), hints alone with a binary
 *                destination (libfabric's verbs provider), hints alone with source and destination, a node
 *                with a binary source, RAI_NUMERICHOST with a name, RAI_FAMILY, and nothing at all.
 *   server       a synchronous listener (rdma_create_ep + rdma_listen); rdma_get_request's id holds its
 *                CONNECT_REQUEST (with the client's private data) in id->event; rdma_accept with the server's
 *                advertisement as private data leaves ESTABLISHED there; rdma_disconnect leaves DISCONNECTED.
 *   client       rdma_create_ep leaves ROUTE_RESOLVED in id->event; rdma_connect leaves ESTABLISHED, whose
 *                private data is the server's advertisement; rdma_migrate_id(id, NULL) of a synchronous id is
 *                EINVAL; rdma_disconnect leaves DISCONNECTED.
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define CLIENT_DATA "hello-from-client"
#define SERVER_DATA "server-advertisement:rkey=0x1234"

static const char *addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN];

	if (!sa) {
		snprintf(buf, len, "none");
		return buf;
	}
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)sa;
		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s:%u", ip, ntohs(s->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)sa;
		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, ntohs(s->sin6_port));
	} else {
		snprintf(buf, len, "family %d", sa->sa_family);
	}
	return buf;
}

/* One line for one rdma_getaddrinfo call: its result or its failure. */
static void show(const char *form, int ret, struct rdma_addrinfo *res)
{
	char src[80], dst[80];

	if (ret) {
		printf("getaddrinfo: %s: failed (%s)\n", form, errno == EINVAL ? "EINVAL" : "an error");
		return;
	}
	printf("getaddrinfo: %s: flags %d family %d qp_type %d ps 0x%x src %s dst %s\n", form, res->ai_flags,
	       res->ai_family, res->ai_qp_type, res->ai_port_space, addr_str(res->ai_src_addr, src, sizeof(src)),
	       addr_str(res->ai_dst_addr, dst, sizeof(dst)));
}

static int getaddrinfo_case(const char *addr, const char *port)
{
	struct rdma_addrinfo hints, *passive = NULL, *active = NULL, *res;
	struct sockaddr_in src;
	int ret;

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(addr, port, &hints, &passive);
	show("node passive", ret, passive);

	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(addr, port, &hints, &active);
	show("node active", ret, active);
	if (!active || !passive)
		return 1;

	/* libfabric's vrb_create_ep: no node, no service, the peer as a binary destination. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_FAMILY;
	hints.ai_family = AF_INET;
	hints.ai_qp_type = IBV_QPT_RC;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_dst_addr = active->ai_dst_addr;
	hints.ai_dst_len = active->ai_dst_len;
	ret = rdma_getaddrinfo(NULL, NULL, &hints, &res);
	show("hints dst", ret, res);
	if (!ret)
		rdma_freeaddrinfo(res);

	memset(&src, 0, sizeof(src));
	src.sin_family = AF_INET;
	src.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	src.sin_port = htons(7);
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	ret = rdma_getaddrinfo(NULL, NULL, &hints, &res);
	show("hints src dst", ret, res);
	if (!ret)
		rdma_freeaddrinfo(res);

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	ret = rdma_getaddrinfo(addr, port, &hints, &res);
	show("node with src", ret, res);
	if (!ret)
		rdma_freeaddrinfo(res);

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST;
	ret = rdma_getaddrinfo("localhost", port, &hints, &res);
	show("numeric name", ret, res);
	if (!ret)
		rdma_freeaddrinfo(res);

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_FAMILY | RAI_NUMERICHOST;
	hints.ai_family = AF_INET6;
	ret = rdma_getaddrinfo(addr, port, &hints, &res);
	show("ipv4 as ipv6", ret, res);
	if (!ret)
		rdma_freeaddrinfo(res);

	ret = rdma_getaddrinfo(NULL, NULL, NULL, &res);
	show("nothing", ret, res);

	rdma_freeaddrinfo(passive);
	rdma_freeaddrinfo(active);
	return 0;
}

/* The event a synchronous call left in id->event: its name and its private data, if any. */
static void show_event(const char *who, const char *call, struct rdma_cm_id *id)
{
	struct rdma_cm_event *e = id->event;

	if (!e) {
		printf("%s: after %s, id->event is NULL\n", who, call);
		return;
	}
	printf("%s: after %s, id->event is %s", who, call, rdma_event_str(e->event));
	if (e->param.conn.private_data && e->param.conn.private_data_len)
		printf(" with \"%.*s\"", (int)strnlen(e->param.conn.private_data, e->param.conn.private_data_len),
		       (const char *)e->param.conn.private_data);
	printf("\n");
}

static struct rdma_addrinfo *lookup(const char *addr, const char *port, int flags)
{
	struct rdma_addrinfo hints, *res;

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = flags;
	hints.ai_port_space = RDMA_PS_TCP;
	if (rdma_getaddrinfo(addr, port, &hints, &res)) {
		printf("SETUP rdma_getaddrinfo %s:%s failed (%s)\n", addr, port, strerror(errno));
		return NULL;
	}
	return res;
}

static void qp_attr(struct ibv_qp_init_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	attr->cap.max_send_wr = attr->cap.max_recv_wr = 4;
	attr->cap.max_send_sge = attr->cap.max_recv_sge = 1;
	attr->sq_sig_all = 1;
}

static int server_case(const char *addr, const char *port)
{
	struct rdma_addrinfo *res = lookup(addr, port, RAI_PASSIVE);
	struct rdma_cm_id *listen_id, *id;
	struct rdma_conn_param param;
	struct ibv_qp_init_attr attr;

	if (!res)
		return 1;
	qp_attr(&attr);
	if (rdma_create_ep(&listen_id, res, NULL, &attr) || rdma_listen(listen_id, 1)) {
		printf("SETUP server: rdma_create_ep/rdma_listen failed (%s)\n", strerror(errno));
		return 1;
	}
	rdma_freeaddrinfo(res);
	printf("server: listening\n");
	fflush(stdout);
	if (rdma_get_request(listen_id, &id)) {
		printf("server: rdma_get_request failed (%s)\n", strerror(errno));
		return 1;
	}
	show_event("server", "rdma_get_request", id);
	printf("server: the new id has %s QP and %s channel\n", id->qp ? "a" : "no",
	       id->channel && id->channel != listen_id->channel ? "its own" : "no own");
	memset(&param, 0, sizeof(param));
	param.private_data = SERVER_DATA;
	param.private_data_len = sizeof(SERVER_DATA);
	if (rdma_accept(id, &param)) {
		printf("server: rdma_accept failed (%s)\n", strerror(errno));
		return 1;
	}
	show_event("server", "rdma_accept", id);
	if (rdma_disconnect(id)) {
		printf("server: rdma_disconnect failed (%s)\n", strerror(errno));
		return 1;
	}
	show_event("server", "rdma_disconnect", id);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	printf("server: done\n");
	return 0;
}

static int client_case(const char *addr, const char *port)
{
	struct rdma_addrinfo *res = lookup(addr, port, 0);
	struct rdma_conn_param param;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id;
	int ret;

	if (!res)
		return 1;
	qp_attr(&attr);
	if (rdma_create_ep(&id, res, NULL, &attr)) {
		printf("SETUP client: rdma_create_ep failed (%s)\n", strerror(errno));
		return 1;
	}
	rdma_freeaddrinfo(res);
	show_event("client", "rdma_create_ep", id);
	memset(&param, 0, sizeof(param));
	param.private_data = CLIENT_DATA;
	param.private_data_len = sizeof(CLIENT_DATA);
	if (rdma_connect(id, &param)) {
		printf("client: rdma_connect failed (%s)\n", strerror(errno));
		return 1;
	}
	show_event("client", "rdma_connect", id);
	ret = rdma_migrate_id(id, NULL);
	printf("client: rdma_migrate_id(id, NULL) returned %d (%s)\n", ret,
	       ret && errno == EINVAL ? "EINVAL" : "not EINVAL");
	if (rdma_disconnect(id)) {
		printf("client: rdma_disconnect failed (%s)\n", strerror(errno));
		return 1;
	}
	show_event("client", "rdma_disconnect", id);
	rdma_destroy_ep(id);
	printf("client: done\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 4) {
		fprintf(stderr, "usage: sync_cm getaddrinfo|server|client ADDR PORT\n");
		return 2;
	}
	if (!strcmp(argv[1], "getaddrinfo"))
		return getaddrinfo_case(argv[2], argv[3]);
	if (!strcmp(argv[1], "server"))
		return server_case(argv[2], argv[3]);
	if (!strcmp(argv[1], "client"))
		return client_case(argv[2], argv[3]);
	fprintf(stderr, "sync_cm: unknown case %s\n", argv[1]);
	return 2;
}
