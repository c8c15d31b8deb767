/*
 * cm_peer: an rdma_cm (librdmacm) endpoint for soft-rdma's interoperability suite. It runs inside the
 * siw VM, on the real iWARP stack (siw + iw_cm + rdma_cm), and reports what the connection manager
 * delivered, one line per event, so the suite can compare both ends of every rule:
 *
 *   cm_peer listen  ADDR PORT [--pd HEX] [--reject HEX] [--ird N] [--ord N] [--hold SEC]
 *   cm_peer connect ADDR PORT [--pd HEX] [--ird N] [--ord N] [--hold SEC]
 *
 *   LISTENING port=P
 *   CONNECT_REQUEST pd=HEX responder_resources=N initiator_depth=N
 *   ESTABLISHED pd=HEX responder_resources=N initiator_depth=N
 *   REJECTED status=N pd=HEX
 *   DISCONNECTED
 *   ERROR what=... errno=N
 *
 * --pd is the private data of the Request (connect) or the Reply (listen); --reject answers the Request
 * with a reject carrying that private data; --ird/--ord are responder_resources/initiator_depth (RFC 6581
 * IRD/ORD in the MPA v2 word). After ESTABLISHED the peer waits --hold seconds (default 10) for a
 * DISCONNECTED from the other side, then disconnects itself; with --hold 0 it disconnects at once.
 *
 * The listener serves exactly one connection request, then exits.
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

static unsigned char pd[1024], rej[1024];
static int pd_len = 0, rej_len = -1, ird = 1, ord = 1, hold = 10;

static int unhex(const char *s, unsigned char *out, int max)
{
	int n = 0;
	while (s[0] && s[1] && n < max) {
		unsigned int b;
		if (sscanf(s, "%2x", &b) != 1)
			return -1;
		out[n++] = (unsigned char)b;
		s += 2;
	}
	return s[0] ? -1 : n;
}

static void hex(const void *p, int len)
{
	const unsigned char *b = p;
	if (len <= 0) {
		printf("-");
		return;
	}
	for (int i = 0; i < len; i++)
		printf("%02x", b[i]);
}

static void fail(const char *what)
{
	printf("ERROR what=%s errno=%d\n", what, errno);
	fflush(stdout);
	exit(1);
}

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, int timeout_ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *ev;
	if (timeout_ms >= 0 && poll(&p, 1, timeout_ms) == 0)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		fail("rdma_get_cm_event");
	return ev;
}

static void print_conn(const char *name, struct rdma_cm_event *ev)
{
	printf("%s pd=", name);
	hex(ev->param.conn.private_data, ev->param.conn.private_data_len);
	printf(" responder_resources=%u initiator_depth=%u\n", ev->param.conn.responder_resources,
	       ev->param.conn.initiator_depth);
	fflush(stdout);
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_pd *ibpd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = ibpd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr a = {0};
	if (!cq)
		fail("ibv_create_cq");
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, ibpd, &a))
		fail("rdma_create_qp");
}

/* After ESTABLISHED: wait for the other side's disconnect, or disconnect after --hold seconds. */
static void established(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	struct rdma_cm_event *ev = wait_event(ch, hold * 1000);
	if (!ev) {
		rdma_disconnect(id);
		ev = wait_event(ch, 10000);
		if (!ev) {
			printf("ERROR what=no-disconnect-event errno=0\n");
			exit(1);
		}
		printf("DISCONNECTED initiated=local\n");
	} else if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
		printf("DISCONNECTED initiated=remote\n");
		rdma_disconnect(id);
	} else {
		printf("UNEXPECTED event=%s status=%d\n", rdma_event_str(ev->event), ev->status);
	}
	fflush(stdout);
	rdma_ack_cm_event(ev);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s listen|connect ADDR PORT [--pd HEX] [--reject HEX] [--ird N] [--ord N] [--hold SEC]\n",
			argv[0]);
		return 2;
	}
	for (int i = 4; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--pd"))
			pd_len = unhex(argv[i + 1], pd, sizeof pd);
		else if (!strcmp(argv[i], "--reject"))
			rej_len = unhex(argv[i + 1], rej, sizeof rej);
		else if (!strcmp(argv[i], "--ird"))
			ird = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--ord"))
			ord = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--hold"))
			hold = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (pd_len < 0 || (rej_len < 0 && rej_len != -1)) {
		fprintf(stderr, "bad hex\n");
		return 2;
	}
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(argv[2], argv[3], &hints, &ai))
		fail("getaddrinfo");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id");
	struct rdma_conn_param cp = {0};
	cp.responder_resources = ird;
	cp.initiator_depth = ord;
	cp.private_data = pd;
	cp.private_data_len = pd_len;

	if (!strcmp(argv[1], "listen")) {
		if (rdma_bind_addr(id, ai->ai_addr) || rdma_listen(id, 1))
			fail("rdma_listen");
		printf("LISTENING port=%s\n", argv[3]);
		fflush(stdout);
		ev = wait_event(ch, -1);
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			printf("UNEXPECTED event=%s status=%d\n", rdma_event_str(ev->event), ev->status);
			return 1;
		}
		struct rdma_cm_id *child = ev->id;
		print_conn("CONNECT_REQUEST", ev);
		rdma_ack_cm_event(ev);
		if (rej_len >= 0) {
			if (rdma_reject(child, rej, rej_len))
				fail("rdma_reject");
			printf("REJECT_SENT\n");
			fflush(stdout);
			/* let the reject reach the wire before the process (and the TCP connection) ends */
			ev = wait_event(ch, 3000);
			return 0;
		}
		make_qp(child);
		if (rdma_accept(child, &cp))
			fail("rdma_accept");
		ev = wait_event(ch, 10000);
		if (!ev || ev->event != RDMA_CM_EVENT_ESTABLISHED) {
			printf("UNEXPECTED event=%s status=%d\n", ev ? rdma_event_str(ev->event) : "timeout",
			       ev ? ev->status : 0);
			return 1;
		}
		print_conn("ESTABLISHED", ev);
		rdma_ack_cm_event(ev);
		established(ch, child);
		return 0;
	}

	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 5000))
		fail("rdma_resolve_addr");
	ev = wait_event(ch, 10000);
	if (!ev || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED)
		fail("addr_resolved");
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route");
	ev = wait_event(ch, 10000);
	if (!ev || ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		fail("route_resolved");
	rdma_ack_cm_event(ev);
	make_qp(id);
	if (rdma_connect(id, &cp))
		fail("rdma_connect");
	ev = wait_event(ch, 20000);
	if (!ev) {
		printf("ERROR what=connect-timeout errno=0\n");
		return 1;
	}
	if (ev->event == RDMA_CM_EVENT_REJECTED) {
		printf("REJECTED status=%d pd=", ev->status);
		hex(ev->param.conn.private_data, ev->param.conn.private_data_len);
		printf("\n");
		return 0;
	}
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
		printf("UNEXPECTED event=%s status=%d\n", rdma_event_str(ev->event), ev->status);
		return 1;
	}
	print_conn("ESTABLISHED", ev);
	rdma_ack_cm_event(ev);
	established(ch, id);
	return 0;
}
