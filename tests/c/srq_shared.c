/*
 * srq_shared.c: one shared receive queue (SRQ) shared by several rdma_cm-connected queue pairs, on each
 * side. Written for soft-rdma's srq suite (tests/tests/srq.rs), which compiles it against the system's
 * rdma-core headers (`cc srq_shared.c -libverbs -lrdmacm`) and runs it through `soft-rdma run`; it uses
 * only rdma-core 44's API and stays within kernel siw's limits (RDMA_PS_TCP, one SGE, a nonzero send
 * queue), so the same program runs against siw.
 *
 * Usage: srq_shared server ADDR PORT | srq_shared client ADDR PORT.
 *
 * Each side:
 *   1. checks the device's SRQ attributes (max_srq, max_srq_wr, max_srq_sge nonzero), creates one SRQ and
 *      checks what siw refuses: max_wr 0 at create (EINVAL), IBV_SRQ_MAX_WR in a modify (EOPNOTSUPP), a
 *      limit above the size (EINVAL), a Receive without SGE (EINVAL); ibv_query_srq (rdma-core's siw
 *      provider has none: libibverbs answers EOPNOTSUPP there, taken on siw alone, see query_srq);
 *   2. posts RECVS Receives to the SRQ only, and connects NQP queue pairs created on it (the client
 *      connects them one after the other, so connection i is the i-th on both sides);
 *   3. ping-pong, 2 * NQP rounds: the client sends round k on its queue pair k % NQP, the server answers
 *      on the same connection. Every Receive must complete with the round's data, from the queue pair the
 *      message came on (wc.qp_num), and take the SRQ's Receives in posting order (wr_id == round);
 *   4. arms the SRQ limit at the number of Receives left, runs one more round and waits for
 *      IBV_EVENT_SRQ_LIMIT_REACHED naming its SRQ;
 *   5. ibv_destroy_srq while the queue pairs live: EBUSY; then disconnects, destroys the queue pairs and
 *      the SRQ (0).
 * It ends with one line, `srq_shared ROLE: PASS` or `srq_shared ROLE: FAIL: why`, exit status 0 or 1.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define NQP 3
#define RECVS 8
#define SRQ_WR 16
#define MSG 64
#define ROUNDS (2 * NQP)
#define TIMEOUT_MS 20000

static const char *role;

static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("srq_shared %s: FAIL: ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

struct side {
	struct rdma_event_channel *ch;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *send_cq, *recv_cq;
	struct ibv_srq *srq;
	struct ibv_mr *recv_mr, *send_mr;
	char recv_buf[SRQ_WR * MSG];
	char send_buf[MSG];
	struct rdma_cm_id *ids[NQP];
	int nids;
};

static long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The next CM event (acked): its type in `*type`, its id. */
static struct rdma_cm_id *next_event(struct side *s, enum rdma_cm_event_type *type, const char *waiting)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct pollfd p = { .fd = s->ch->fd, .events = POLLIN };

	if (poll(&p, 1, TIMEOUT_MS) != 1)
		fail("no CM event within %d ms (waiting for %s)", TIMEOUT_MS, waiting);
	if (rdma_get_cm_event(s->ch, &ev))
		fail("rdma_get_cm_event: %s", strerror(errno));
	if (ev->status)
		fail("CM event %s with status %d", rdma_event_str(ev->event), ev->status);
	*type = ev->event;
	id = ev->id;
	rdma_ack_cm_event(ev);
	return id;
}

/* The next CM event, of type `want` (anything else fails); its id. */
static struct rdma_cm_id *expect_event(struct side *s, enum rdma_cm_event_type want)
{
	enum rdma_cm_event_type got;
	struct rdma_cm_id *id = next_event(s, &got, rdma_event_str(want));

	if (got != want)
		fail("CM event %s, expected %s", rdma_event_str(got), rdma_event_str(want));
	return id;
}

/* ibv_query_srq: 0 and `a` filled, or 1 when the device's provider has no query_srq. rdma-core's siw
 * provider leaves it out of its ops (providers/siw/siw.c, `siw_context_ops`), so libibverbs answers
 * EOPNOTSUPP on siw; soft-rdma's device (softrdma*) must answer. Any other failure fails. */
static int query_srq(struct side *s, struct ibv_srq_attr *a)
{
	int rc = ibv_query_srq(s->srq, a);

	if (rc == EOPNOTSUPP && strncmp(ibv_get_device_name(s->ctx->device), "softrdma", 8)) {
		printf("srq_shared %s: ibv_query_srq: not supported by %s's provider (siw's has none)\n", role,
		       ibv_get_device_name(s->ctx->device));
		return 1;
	}
	if (rc)
		fail("ibv_query_srq on %s: %s", ibv_get_device_name(s->ctx->device), strerror(rc));
	return 0;
}

/* PD, CQs, the SRQ and the memory, on the device of the first connection; step 1's checks. */
static void setup(struct side *s, struct ibv_context *ctx)
{
	struct ibv_device_attr da;
	struct ibv_srq_init_attr ia = { .attr = { .max_wr = 0, .max_sge = 1 } };
	struct ibv_srq_attr a;
	struct ibv_recv_wr wr = { 0 }, *bad;
	int rc;

	s->ctx = ctx;
	if (ibv_query_device(ctx, &da))
		fail("ibv_query_device: %s", strerror(errno));
	if (da.max_srq <= 0 || da.max_srq_wr < SRQ_WR || da.max_srq_sge < 1)
		fail("device attributes max_srq %d, max_srq_wr %d, max_srq_sge %d", da.max_srq, da.max_srq_wr,
		     da.max_srq_sge);
	s->pd = ibv_alloc_pd(ctx);
	s->send_cq = ibv_create_cq(ctx, 4 * NQP, NULL, NULL, 0);
	s->recv_cq = ibv_create_cq(ctx, SRQ_WR, NULL, NULL, 0);
	if (!s->pd || !s->send_cq || !s->recv_cq)
		fail("PD or CQ: %s", strerror(errno));
	errno = 0;
	if (ibv_create_srq(s->pd, &ia) || errno != EINVAL)
		fail("ibv_create_srq with max_wr 0: %s, expected EINVAL", strerror(errno));
	ia.attr.max_wr = SRQ_WR;
	s->srq = ibv_create_srq(s->pd, &ia);
	if (!s->srq)
		fail("ibv_create_srq: %s", strerror(errno));
	a.max_wr = 2 * SRQ_WR;
	if ((rc = ibv_modify_srq(s->srq, &a, IBV_SRQ_MAX_WR)) != EOPNOTSUPP)
		fail("ibv_modify_srq IBV_SRQ_MAX_WR returned %d (%s), expected EOPNOTSUPP", rc, strerror(rc));
	if (!query_srq(s, &a) && (a.max_wr < SRQ_WR || a.max_sge < 1 || a.srq_limit != 0))
		fail("ibv_query_srq: max_wr %u, max_sge %u, srq_limit %u", a.max_wr, a.max_sge, a.srq_limit);
	/* ibv_create_srq(3): the attributes come back with the SRQ's actual size */
	a.srq_limit = ia.attr.max_wr + 1;
	if ((rc = ibv_modify_srq(s->srq, &a, IBV_SRQ_LIMIT)) != EINVAL)
		fail("ibv_modify_srq with a limit above the size returned %d (%s), expected EINVAL", rc,
		     strerror(rc));
	wr.wr_id = 99;
	wr.num_sge = 0;
	/* rdma-core's siw provider answers -EINVAL (negated, `siw_post_srq_recv`); ibv_post_srq_recv(3) says
	 * an errno value. Either is the refusal. */
	rc = ibv_post_srq_recv(s->srq, &wr, &bad);
	if ((rc != EINVAL && rc != -EINVAL) || bad != &wr)
		fail("ibv_post_srq_recv without SGE returned %d (%s), expected EINVAL", rc, strerror(rc));
	s->recv_mr = ibv_reg_mr(s->pd, s->recv_buf, sizeof(s->recv_buf), IBV_ACCESS_LOCAL_WRITE);
	s->send_mr = ibv_reg_mr(s->pd, s->send_buf, sizeof(s->send_buf), IBV_ACCESS_LOCAL_WRITE);
	if (!s->recv_mr || !s->send_mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	/* Step 2: the Receives, all on the SRQ, wr_id = slot. */
	for (int i = 0; i < RECVS; i++) {
		struct ibv_sge sge = {
			.addr = (uintptr_t)(s->recv_buf + i * MSG), .length = MSG, .lkey = s->recv_mr->lkey,
		};
		struct ibv_recv_wr r = { .wr_id = i, .sg_list = &sge, .num_sge = 1 };

		if ((rc = ibv_post_srq_recv(s->srq, &r, &bad)))
			fail("ibv_post_srq_recv %d: %s", i, strerror(rc < 0 ? -rc : rc));
	}
}

/* A queue pair on the SRQ for `id` (rdma_create_qp with attr.srq). */
static void create_qp(struct side *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = s->send_cq,
		.recv_cq = s->recv_cq,
		.srq = s->srq,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	if (rdma_create_qp(id, s->pd, &qa))
		fail("rdma_create_qp with attr.srq: %s", strerror(errno));
	if (id->qp->srq != s->srq)
		fail("qp->srq is not the SRQ");
	s->ids[s->nids++] = id;
}

static int index_of(struct side *s, uint32_t qp_num)
{
	for (int i = 0; i < s->nids; i++)
		if (s->ids[i]->qp->qp_num == qp_num)
			return i;
	return -1;
}

static void poll_one(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	long deadline = now_ms() + TIMEOUT_MS;
	int n;

	while ((n = ibv_poll_cq(cq, 1, wc)) == 0)
		if (now_ms() > deadline)
			fail("no %s completion within %d ms", what, TIMEOUT_MS);
	if (n < 0)
		fail("ibv_poll_cq: %d", n);
	if (wc->status != IBV_WC_SUCCESS)
		fail("%s completion wr_id %llu: %s", what, (unsigned long long)wc->wr_id,
		     ibv_wc_status_str(wc->status));
}

static void send_round(struct side *s, int k, int qp)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->send_buf, .lkey = s->send_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1000 + k, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	int rc;

	sge.length = snprintf(s->send_buf, MSG, "%s round %d qp %d", role, k, qp) + 1;
	if ((rc = ibv_post_send(s->ids[qp]->qp, &wr, &bad)))
		fail("ibv_post_send round %d: %s", k, strerror(rc));
	poll_one(s->send_cq, &wc, "send");
	if (wc.wr_id != (uint64_t)(1000 + k) || wc.opcode != IBV_WC_SEND)
		fail("send completion wr_id %llu opcode %d", (unsigned long long)wc.wr_id, wc.opcode);
}

/* Round k's Receive: from the peer `from`, on queue pair k % NQP, into SRQ slot k. */
static void recv_round(struct side *s, int k, const char *from)
{
	struct ibv_wc wc;
	char want[MSG];
	int qp = k % NQP, got;

	poll_one(s->recv_cq, &wc, "receive");
	got = index_of(s, wc.qp_num);
	snprintf(want, sizeof(want), "%s round %d qp %d", from, k, qp);
	if (wc.opcode != IBV_WC_RECV)
		fail("round %d: receive completion opcode %d", k, wc.opcode);
	if (got != qp)
		fail("round %d: came on queue pair %d (qp_num %u), expected %d", k, got, wc.qp_num, qp);
	if (wc.wr_id != (uint64_t)k)
		fail("round %d: took SRQ Receive %llu, expected %d (posting order)", k,
		     (unsigned long long)wc.wr_id, k);
	if (wc.wr_id >= SRQ_WR || wc.byte_len != strlen(want) + 1 ||
	    strcmp(s->recv_buf + wc.wr_id * MSG, want))
		fail("round %d: received %u bytes \"%.*s\", expected \"%s\"", k, wc.byte_len, MSG,
		     s->recv_buf + (wc.wr_id % SRQ_WR) * MSG, want);
}

static void arm(struct side *s, uint32_t limit)
{
	struct ibv_srq_attr a = { .srq_limit = limit };
	int rc;

	if ((rc = ibv_modify_srq(s->srq, &a, IBV_SRQ_LIMIT)))
		fail("ibv_modify_srq IBV_SRQ_LIMIT %u: %s", limit, strerror(rc));
	if (!query_srq(s, &a) && a.srq_limit != limit)
		fail("ibv_query_srq after arming: srq_limit %u, expected %u", a.srq_limit, limit);
}

static void wait_limit_event(struct side *s)
{
	struct pollfd p = { .fd = s->ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	for (;;) {
		if (poll(&p, 1, TIMEOUT_MS) != 1)
			fail("no IBV_EVENT_SRQ_LIMIT_REACHED within %d ms", TIMEOUT_MS);
		if (ibv_get_async_event(s->ctx, &ev))
			fail("ibv_get_async_event: %s", strerror(errno));
		int type = ev.event_type;
		void *srq = ev.element.srq;

		ibv_ack_async_event(&ev);
		if (type == IBV_EVENT_SRQ_LIMIT_REACHED) {
			if (srq != s->srq)
				fail("IBV_EVENT_SRQ_LIMIT_REACHED for another SRQ");
			return;
		}
		printf("srq_shared %s: async event %s (not the limit), waiting on\n", role,
		       ibv_event_type_str(type));
	}
}

static void connect_all(struct side *s, const char *addr, const char *port, int server)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				      .srq = 1 };
	struct rdma_cm_id *listen_id, *id;

	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(addr, port, &hints, &ai))
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, strerror(errno));
	s->ch = rdma_create_event_channel();
	if (!s->ch)
		fail("rdma_create_event_channel: %s", strerror(errno));
	if (server) {
		if (rdma_create_id(s->ch, &listen_id, NULL, RDMA_PS_TCP) ||
		    rdma_bind_addr(listen_id, ai->ai_src_addr) || rdma_listen(listen_id, NQP))
			fail("listening on %s:%s: %s", addr, port, strerror(errno));
		/* Bound to an address, the id has its device: set up before any connection comes. */
		if (listen_id->verbs)
			setup(s, listen_id->verbs);
		printf("srq_shared server: listening\n");
		fflush(stdout);
		/* A connection's ESTABLISHED may come after the next one's request (iWARP: the passive side's
		 * comes with the initiator's first FPDU). Requests come in the client's order. */
		for (int established = 0; established < NQP;) {
			enum rdma_cm_event_type type;

			id = next_event(s, &type, "CONNECT_REQUEST or ESTABLISHED");
			if (type == RDMA_CM_EVENT_ESTABLISHED) {
				established++;
				continue;
			}
			if (type != RDMA_CM_EVENT_CONNECT_REQUEST || s->nids == NQP)
				fail("CM event %s while accepting", rdma_event_str(type));
			if (!s->ctx)
				setup(s, id->verbs);
			create_qp(s, id);
			if (rdma_accept(id, &cp))
				fail("rdma_accept %d: %s", s->nids - 1, strerror(errno));
		}
	} else {
		for (int i = 0; i < NQP; i++) {
			if (rdma_create_id(s->ch, &id, NULL, RDMA_PS_TCP) ||
			    rdma_resolve_addr(id, NULL, ai->ai_dst_addr, TIMEOUT_MS))
				fail("rdma_resolve_addr: %s", strerror(errno));
			expect_event(s, RDMA_CM_EVENT_ADDR_RESOLVED);
			if (rdma_resolve_route(id, TIMEOUT_MS))
				fail("rdma_resolve_route: %s", strerror(errno));
			expect_event(s, RDMA_CM_EVENT_ROUTE_RESOLVED);
			if (!s->ctx)
				setup(s, id->verbs);
			create_qp(s, id);
			if (rdma_connect(id, &cp))
				fail("rdma_connect %d: %s", i, strerror(errno));
			expect_event(s, RDMA_CM_EVENT_ESTABLISHED);
		}
	}
	rdma_freeaddrinfo(ai);
}

int main(int argc, char **argv)
{
	static struct side s;
	int server, rc;

	if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: srq_shared server|client ADDR PORT\n");
		return 2;
	}
	role = argv[1];
	server = !strcmp(role, "server");
	connect_all(&s, argv[2], argv[3], server);
	/* Step 3: ping-pong over the queue pairs in turn. */
	for (int k = 0; k < ROUNDS; k++) {
		if (server) {
			recv_round(&s, k, "client");
			if (k == ROUNDS - 1)
				arm(&s, RECVS - ROUNDS);
			send_round(&s, k, k % NQP);
		} else {
			send_round(&s, k, k % NQP);
			recv_round(&s, k, "server");
		}
	}
	/* Step 4: RECVS - ROUNDS Receives are left; the limit at that many fires after one more. */
	if (!server)
		arm(&s, RECVS - ROUNDS);
	if (server) {
		recv_round(&s, ROUNDS, "client");
		wait_limit_event(&s);
		send_round(&s, ROUNDS, ROUNDS % NQP);
	} else {
		send_round(&s, ROUNDS, ROUNDS % NQP);
		recv_round(&s, ROUNDS, "server");
		wait_limit_event(&s);
	}
	/* Step 5. */
	if ((rc = ibv_destroy_srq(s.srq)) != EBUSY)
		fail("ibv_destroy_srq with queue pairs on it returned %d (%s), expected EBUSY", rc, strerror(rc));
	for (int i = 0; i < NQP; i++) {
		if (!server && rdma_disconnect(s.ids[i]))
			fail("rdma_disconnect: %s", strerror(errno));
		expect_event(&s, RDMA_CM_EVENT_DISCONNECTED);
	}
	for (int i = 0; i < NQP; i++) {
		rdma_destroy_qp(s.ids[i]);
		rdma_destroy_id(s.ids[i]);
	}
	if ((rc = ibv_destroy_srq(s.srq)))
		fail("ibv_destroy_srq: %s", strerror(rc));
	ibv_dereg_mr(s.recv_mr);
	ibv_dereg_mr(s.send_mr);
	ibv_destroy_cq(s.send_cq);
	ibv_destroy_cq(s.recv_cq);
	ibv_dealloc_pd(s.pd);
	printf("srq_shared %s: PASS\n", role);
	return 0;
}
