/* protection: RDMA's protection model tested from the attacker's side (issue 40).
 *
 * Plain rdma-core (44) over rdma_cm, RDMA_PS_TCP: runs the same against soft-rdma and against kernel siw.
 *
 *   protection server PORT CONNECTIONS   a target holding two protection domains, 0 and 1, each with a
 *                                         read-write, a read-only, a deregistered and an invalidatable
 *                                         region; it answers CONNECTIONS connections, each on the queue
 *                                         pair of the PD its client names, and prints one verdict a case.
 *   protection client HOST PORT ID       client ID (0 or 1) runs every case on a fresh connection: its own
 *                                         PD's region (the control), then accesses it must not get.
 *
 * Every case is one line "CASE <name> client <id>: PASS|FAIL (<what happened>)"; the exit status is 0 when
 * every line of the process says PASS. The server leaks every region's rkey and address to every client
 * (in the accept's private data): the attacker is assumed to have learnt or guessed them.
 *
 * A refused access must leave every byte of the target untouched and end the connection (the target
 * sends a Terminate and its queue pair moves to Error: siw_check_mem, siw_qp_cm_drop), and raise the async
 * event siw raises (target_event). A local protection error (bad lkey) fails the request with
 * IBV_WC_LOC_PROT_ERR or IBV_WC_LOC_QP_OP_ERR (siw's), the queue pair flushes what follows, and the
 * requester gets IBV_EVENT_QP_FATAL.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAGIC 0x50524f54u /* "PROT" */
#define LEN 4096
#define GUARD 64
#define NREG 4 /* rw, ro, dead, inv */
enum { RW, RO, DEAD, INV };
enum {
	OWN_WRITE,
	OTHER_PD_WRITE,
	OTHER_PD_READ,
	DEREG_WRITE,
	INVAL_WRITE,
	READONLY_WRITE,
	OUT_OF_RANGE_WRITE,
	BELOW_RANGE_WRITE,
	WRAPPED_WRITE,
	BAD_LKEY,
	NCASES
};
static const char *case_name[NCASES] = {
	"own-write",	  "other-pd-write",	"other-pd-read",     "deregistered-write", "invalidated-write",
	"read-only-write", "out-of-range-write", "below-range-write", "wrapped-offset-write", "bad-lkey",
};

struct hello {
	uint32_t magic, id, kase;
};
struct remote {
	uint64_t addr;
	uint32_t rkey;
} __attribute__((packed));
struct info {
	uint32_t magic;
	struct remote r[2][NREG];
} __attribute__((packed));

static int failures;

static void die(const char *what)
{
	fprintf(stderr, "protection: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void verdict(int kase, int id, int pass, const char *how)
{
	printf("CASE %s client %d: %s (%s)\n", case_name[kase], id, pass ? "PASS" : "FAIL", how);
	fflush(stdout);
	if (!pass)
		failures++;
}

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ec)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ec, &ev))
		die("rdma_get_cm_event");
	return ev;
}

/* CONNECT_REQUESTs that came while the server was still ending the previous connection: the next client
 * may connect as soon as its own side of the last connection is over, before the server's DISCONNECTED
 * (which waits for the client's FIN: iw_cm reports it on IW_CM_EVENT_CLOSE). They are kept, not
 * acknowledged, for the server's loop. */
#define MAX_KEPT 8
static struct rdma_cm_event *kept[MAX_KEPT];
static int nkept;

/* Keeps `ev` for the server's loop if it is a CONNECT_REQUEST (1), else leaves it to the caller (0). */
static int keep_request(struct rdma_cm_event *ev)
{
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		return 0;
	if (nkept == MAX_KEPT) {
		fprintf(stderr, "protection: more than %d connect requests waiting\n", MAX_KEPT);
		exit(2);
	}
	kept[nkept++] = ev;
	return 1;
}

/* The channel's next event other than a CONNECT_REQUEST (those are kept for `server`). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ec)
{
	for (;;) {
		struct rdma_cm_event *ev = wait_event(ec);
		if (!keep_request(ev))
			return ev;
	}
}

/* The oldest kept CONNECT_REQUEST, else the channel's next event. */
static struct rdma_cm_event *next_request(struct rdma_event_channel *ec)
{
	if (!nkept)
		return wait_event(ec);
	struct rdma_cm_event *ev = kept[0];
	memmove(kept, kept + 1, --nkept * sizeof(kept[0]));
	return ev;
}

/* How long a side waits for what its peer owes it (a completion, an async event, DISCONNECTED) before it
 * says so and goes on: long beside any answer seen (milliseconds), short beside the suites' deadlines. */
#define PATIENCE_MS 5000

static long long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits for DISCONNECTED on `id` (the other events of that id are acknowledged and skipped; a next
 * connection's request is kept), `ms` at most; 1 if it came. */
static int disconnected_in_time(struct rdma_event_channel *ec, int ms)
{
	long long deadline = now_ms() + ms;
	for (;;) {
		struct pollfd p = {.fd = ec->fd, .events = POLLIN};
		long long left = deadline - now_ms();
		int n = left > 0 ? poll(&p, 1, (int)left) : 0;
		if (n < 0)
			die("poll (rdma_cm channel)");
		if (n == 0)
			return 0;
		struct rdma_cm_event *ev = next_event(ec);
		enum rdma_cm_event_type t = ev->event;
		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED)
			return 1;
	}
}

/* disconnected_in_time, where a peer that never ends the connection is reported and counted as a failure
 * (the case goes on to tear it down). */
static void wait_disconnected(struct rdma_event_channel *ec)
{
	if (!disconnected_in_time(ec, PATIENCE_MS)) {
		printf("  no DISCONNECTED in %d ms\n", PATIENCE_MS);
		fflush(stdout);
		failures++;
	}
}

/* ---------------------------------------------------------------------------------------------- events */

/* What a case's queue pair may raise on the context's async fd (verbs.h enum ibv_event_type), as siw does
 * (siw_qp_event): NONE, or one event; EITHER: siw raises IBV_EVENT_QP_ACCESS_ERR where soft-rdma raises
 * none (a wrapped offset: soft-rdma's requester refuses it at the post, siw's target refuses it), so
 * either is accepted, without waiting. */
enum { NONE = -1, EITHER = -2 };

/* The target's event for each case: IBV_EVENT_QP_ACCESS_ERR for a Write siw_check_mem refuses (an
 * invalidated STag included), IBV_EVENT_QP_REQ_ERR for a refused Read source (siw: its Read Response fails
 * at transmit), none for an STag that names no region (siw_mem_id2obj fails first) and for the peer's
 * Terminate (bad lkey). */
static int target_event(int kase)
{
	switch (kase) {
	case OTHER_PD_WRITE:
	case READONLY_WRITE:
	case OUT_OF_RANGE_WRITE:
	case BELOW_RANGE_WRITE:
	case INVAL_WRITE: return IBV_EVENT_QP_ACCESS_ERR;
	case OTHER_PD_READ: return IBV_EVENT_QP_REQ_ERR;
	case WRAPPED_WRITE: return EITHER;
	default: return NONE;
	}
}

/* Takes `ctx`'s async events: waits for `want` on `qp` if it is an event, then takes what else is there
 * without waiting. 1 if what came is what `want` allows (nothing else, nor for another queue pair); `out`
 * says what came. */
static int check_events(struct ibv_context *ctx, struct ibv_qp *qp, int want, char *out, size_t n)
{
	int fd = ctx->async_fd, got = NONE, stray = 0;
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
		die("fcntl (async fd)");
	for (;;) {
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev)) {
			if (errno != EAGAIN)
				die("ibv_get_async_event");
			if (want >= 0 && got == NONE) {
				/* Waited for PATIENCE_MS at most: then what came (nothing) is the verdict's. */
				struct pollfd p = {.fd = fd, .events = POLLIN};
				int n = poll(&p, 1, PATIENCE_MS);
				if (n < 0)
					die("poll (async fd)");
				if (n > 0)
					continue;
			}
			break;
		}
		int of_qp = ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_QP_REQ_ERR ||
			    ev.event_type == IBV_EVENT_QP_ACCESS_ERR;
		/* Not errors, and not what protection is about: kernel siw raises SQ_DRAINED when it flushes
		 * its send queue as the queue pair leaves RTS (siw_qp.c, siw_sq_flush). */
		int informational = ev.event_type == IBV_EVENT_SQ_DRAINED || ev.event_type == IBV_EVENT_COMM_EST ||
				    ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED;
		if (informational)
			;
		else if (of_qp && ev.element.qp == qp && got == NONE)
			got = ev.event_type;
		else
			stray = ev.event_type + 1;
		ibv_ack_async_event(&ev);
	}
	snprintf(out, n, "event %s%s%s", got == NONE ? "none" : ibv_event_type_str(got),
		 stray ? ", and a stray " : "", stray ? ibv_event_type_str(stray - 1) : "");
	if (stray)
		return 0;
	if (want == EITHER)
		return got == NONE || got == IBV_EVENT_QP_ACCESS_ERR;
	return got == want;
}

/* ---------------------------------------------------------------------------------------------- server */

/* Each region's memory has GUARD bytes before and after it, never registered: they must stay as filled. */
static uint8_t *mem[2][NREG];
static struct ibv_mr *mr[2][NREG];
static struct ibv_pd *pd[2];
static struct info info;

static uint8_t fill_of(int p, int r)
{
	return (uint8_t)(0xA0 + p * 0x10 + r);
}

static void fill_all(void)
{
	for (int p = 0; p < 2; p++)
		for (int r = 0; r < NREG; r++)
			memset(mem[p][r], fill_of(p, r), LEN + 2 * GUARD);
}

/* 1 if every byte of every region (and its guards) is as filled, except those of region `skip` (-1: none). */
static int untouched(int skip_p, int skip_r)
{
	for (int p = 0; p < 2; p++)
		for (int r = 0; r < NREG; r++) {
			if (p == skip_p && r == skip_r)
				continue;
			for (int i = 0; i < LEN + 2 * GUARD; i++)
				if (mem[p][r][i] != fill_of(p, r))
					return 0;
		}
	return 1;
}

static void setup_regions(struct ibv_context *ctx)
{
	int access[NREG] = {
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	info.magic = MAGIC;
	for (int p = 0; p < 2; p++) {
		pd[p] = ibv_alloc_pd(ctx);
		if (!pd[p])
			die("ibv_alloc_pd");
		for (int r = 0; r < NREG; r++) {
			mem[p][r] = malloc(LEN + 2 * GUARD);
			if (!mem[p][r])
				die("malloc");
			mr[p][r] = ibv_reg_mr(pd[p], mem[p][r] + GUARD, LEN, access[r]);
			if (!mr[p][r])
				die("ibv_reg_mr");
			info.r[p][r].addr = (uintptr_t)(mem[p][r] + GUARD);
			info.r[p][r].rkey = mr[p][r]->rkey;
		}
		/* The deregistered region: its rkey is leaked, its memory kept (and watched). */
		if (ibv_dereg_mr(mr[p][DEAD]))
			die("ibv_dereg_mr");
		mr[p][DEAD] = NULL;
	}
	fill_all();
}

/* One connection: its verdict. */
static void serve(struct rdma_event_channel *ec, struct rdma_cm_id *id, const struct hello *h)
{
	int c = h->id, kase = h->kase;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(id->verbs);
	struct ibv_cq *cq = ch ? ibv_create_cq(id->verbs, 8, NULL, ch, 0) : NULL;
	if (!cq)
		die("ibv_create_cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1},
	};
	if (rdma_create_qp(id, pd[c], &qa))
		die("rdma_create_qp");
	char rbuf[2][64];
	struct ibv_mr *rmr = ibv_reg_mr(pd[c], rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!rmr)
		die("ibv_reg_mr (receive)");
	for (int i = 0; i < 2; i++) {
		struct ibv_sge s = {.addr = (uintptr_t)rbuf[i], .length = 64, .lkey = rmr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
		if (ibv_post_recv(id->qp, &wr, &bad))
			die("ibv_post_recv");
	}
	struct rdma_conn_param cp = {.private_data = &info, .private_data_len = sizeof(info),
				     .responder_resources = 1, .initiator_depth = 1};
	if (rdma_accept(id, &cp))
		die("rdma_accept");
	if (ibv_req_notify_cq(cq, 0))
		die("ibv_req_notify_cq");

	/* Until "done" arrives, a Receive fails (the queue pair went to Error) or the connection ends. */
	int done = 0, invalidated = 0, ended = 0, established = 0;
	char how[160] = "";
	while (!done && !ended) {
		struct ibv_wc wc;
		int n;
		while (!done && !ended && (n = ibv_poll_cq(cq, 1, &wc)) > 0) {
			if (wc.status != IBV_WC_SUCCESS) {
				snprintf(how, sizeof(how), "queue pair ended: receive %s", ibv_wc_status_str(wc.status));
				ended = 1;
			} else if (!strncmp(rbuf[wc.wr_id], "done", 4)) {
				done = 1;
			} else if (wc.wc_flags & IBV_WC_WITH_INV) {
				invalidated = wc.invalidated_rkey == info.r[c][INV].rkey;
			}
		}
		if (done || ended)
			break;
		struct pollfd fds[2] = {{.fd = ch->fd, .events = POLLIN}, {.fd = ec->fd, .events = POLLIN}};
		if (poll(fds, 2, -1) < 0)
			die("poll");
		if (fds[0].revents) {
			struct ibv_cq *evq;
			void *ctx;
			if (ibv_get_cq_event(ch, &evq, &ctx))
				die("ibv_get_cq_event");
			ibv_ack_cq_events(evq, 1);
			if (ibv_req_notify_cq(cq, 0))
				die("ibv_req_notify_cq");
		}
		if (fds[1].revents) {
			struct rdma_cm_event *ev = wait_event(ec);
			if (keep_request(ev))
				continue;
			enum rdma_cm_event_type t = ev->event;
			rdma_ack_cm_event(ev);
			if (t == RDMA_CM_EVENT_ESTABLISHED)
				established = 1;
			else if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_CONNECT_ERROR) {
				snprintf(how, sizeof(how), "connection ended: %s", rdma_event_str(t));
				ended = 2;
			}
		}
	}
	/* The connection may have ended (DISCONNECTED) with completions still to poll: the Receive of a Send
	 * with Invalidate, or "done". */
	if (ended == 2) {
		struct ibv_wc wc;
		while (ibv_poll_cq(cq, 1, &wc) > 0) {
			if (wc.status != IBV_WC_SUCCESS)
				continue;
			if (!strncmp(rbuf[wc.wr_id], "done", 4))
				done = 1;
			else if (wc.wc_flags & IBV_WC_WITH_INV)
				invalidated = wc.invalidated_rkey == info.r[c][INV].rkey;
		}
	}
	(void)established;
	char event[96];
	/* A wrapped offset refused here (no "done": siw's requester sends it) raises ACCESS_ERR, and is waited
	 * for, so that it is not left for the next case to take as a stray; one the requester refused at its
	 * post (soft-rdma's) raises nothing here. */
	int want = target_event(kase);
	if (kase == WRAPPED_WRITE)
		want = done ? NONE : IBV_EVENT_QP_ACCESS_ERR;
	int event_ok = check_events(id->verbs, id->qp, want, event, sizeof(event));
	if (kase == OWN_WRITE) {
		int placed = done && mem[c][RW][GUARD] == 0x55 && mem[c][RW][GUARD + LEN - 1] == 0x55;
		int pass = placed && mem[c][RW][0] == fill_of(c, RW) && untouched(c, RW) && event_ok;
		char what[160];
		snprintf(what, sizeof(what), "%s, %s", placed ? "placed, then \"done\"" : "not placed", event);
		verdict(kase, c, pass, what);
		for (int i = GUARD; i < GUARD + LEN; i++)
			mem[c][RW][i] = fill_of(c, RW);
	} else {
		int clean = untouched(-1, -1);
		/* A wrapped tagged offset may be refused by the requester itself (its queue pair carries on). */
		int refused = !done || kase == WRAPPED_WRITE;
		/* Two things the target sees only on soft-rdma. Kernel siw checks a Read's source when it sends
		 * the response (siw_qp_tx.c, siw_qp_sq_proc_tx → siw_check_sgl_tx), after it has taken what
		 * followed the request, "done" included: the client's verdict (its Read got nothing) judges the
		 * case there. And rdma-core's siw provider never sets IBV_WC_WITH_INV (providers/siw/siw.c,
		 * copy_cqe: wc_flags = 0), though siw invalidates the STag (siw_invalidate_stag): there the
		 * refusal of the Write that follows is the proof. */
		int soft_rdma = !strncmp(ibv_get_device_name(id->verbs->device), "softrdma", 8);
		if (kase == OTHER_PD_READ && !soft_rdma)
			refused = 1;
		if (kase == INVAL_WRITE && !invalidated && soft_rdma)
			refused = 0;
		int pass = clean && refused && event_ok;
		char what[300];
		snprintf(what, sizeof(what), "%s%s%s", clean ? "target untouched" : "TARGET BYTES CHANGED",
			 done ? ", \"done\" arrived" : ", ", done ? "" : how);
		if (kase == INVAL_WRITE)
			strncat(what, invalidated ? ", STag invalidated" : soft_rdma ? ", NO INVALIDATION SEEN" :
				", no IBV_WC_WITH_INV (this provider sets none)", sizeof(what) - strlen(what) - 1);
		strncat(what, ", ", sizeof(what) - strlen(what) - 1);
		strncat(what, event, sizeof(what) - strlen(what) - 1);
		verdict(kase, c, pass, what);
		fill_all();
	}
	/* The requester ends each connection once its case is over (and a refusal ends it from here already):
	 * the target waits for that, and disconnects only if it does not come. With kernel siw 6.1 as the
	 * target, an rdma_disconnect racing siw's own drop after a refused access (siw_qp_cm_drop) makes siw
	 * report the close twice, and iw_cm BUG()s on the second (drivers/infiniband/core/iwcm.c,
	 * cm_close_handler: a close in state IDLE), which kills the VM's connection manager. */
	if (ended != 2 && !disconnected_in_time(ec, PATIENCE_MS)) {
		rdma_disconnect(id);
		wait_disconnected(ec);
	}
	rdma_destroy_qp(id);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	rdma_destroy_id(id);
}

static int server(const char *port, int connections)
{
	struct rdma_event_channel *ec = rdma_create_event_channel();
	struct rdma_cm_id *listener;
	if (!ec || rdma_create_id(ec, &listener, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(atoi(port))};
	if (rdma_bind_addr(listener, (struct sockaddr *)&sin) || rdma_listen(listener, 4))
		die("rdma_listen");
	printf("listening on %s\n", port);
	fflush(stdout);
	while (connections > 0) {
		struct rdma_cm_event *ev = next_request(ec);
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);
			continue;
		}
		struct rdma_cm_id *id = ev->id;
		struct hello h = {0};
		if (ev->param.conn.private_data_len >= sizeof(h))
			memcpy(&h, ev->param.conn.private_data, sizeof(h));
		rdma_ack_cm_event(ev);
		if (h.magic != MAGIC || h.id > 1 || h.kase >= NCASES) {
			rdma_reject(id, NULL, 0);
			rdma_destroy_id(id);
			continue;
		}
		if (!pd[0])
			setup_regions(id->verbs);
		serve(ec, id, &h);
		connections--;
	}
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ec);
	return failures ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------- client */

/* No completion came in PATIENCE_MS (a status no provider reports). */
#define NO_COMPLETION ((enum ibv_wc_status)-1)

/* The status of the next completion of `cq` (waited for, PATIENCE_MS at most: then NO_COMPLETION, said,
 * with `*wr_id` 0; the case's verdict decides what it means). Kernel siw 6.1 as the requester leaves the
 * Send queued behind a refused Write uncompleted when the target's Terminate and FIN end the connection
 * before it went out (no flush completion): "done" then reports none, which only the target's verdict
 * cases see. */
static enum ibv_wc_status next_status(struct ibv_cq *cq, uint64_t *wr_id)
{
	struct ibv_wc wc;
	int n;
	long long deadline = now_ms() + PATIENCE_MS;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
		if (now_ms() > deadline) {
			printf("  no completion in %d ms\n", PATIENCE_MS);
			fflush(stdout);
			*wr_id = 0;
			return NO_COMPLETION;
		}
	}
	if (n < 0)
		die("ibv_poll_cq");
	*wr_id = wc.wr_id;
	return wc.status;
}

static const char *status_str(enum ibv_wc_status st)
{
	return st == NO_COMPLETION ? "none in time" : ibv_wc_status_str(st);
}

static void post_send(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, struct ibv_sge *s, uint64_t raddr,
		      uint32_t rkey)
{
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = s, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	if (op == IBV_WR_SEND_WITH_INV) {
		/* verbs.h's field; rdma-core's siw provider reads the STag to invalidate from wr.rdma.rkey
		 * instead (providers/siw/siw.c, push_send_wqe: siw_sqe->rkey = wr.rdma.rkey for every
		 * opcode), and sends STag 0 without it. */
		wr.invalidate_rkey = rkey;
		wr.wr.rdma.rkey = rkey;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	if (ibv_post_send(qp, &wr, &bad)) {
		/* A requester may refuse it at the post (soft-rdma: a remote range that wraps). */
		printf("  post of request %llu refused: %s\n", (unsigned long long)id, strerror(errno));
	}
}

static void one_case(const char *host, const char *port, int me, int kase)
{
	int other = 1 - me;
	struct rdma_event_channel *ec = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	if (!ec || rdma_create_id(ec, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (getaddrinfo(host, port, NULL, &ai))
		die("getaddrinfo");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	freeaddrinfo(ai);
	struct rdma_cm_event *ev = wait_event(ec);
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED)
		die("address not resolved");
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	ev = wait_event(ec);
	if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		die("route not resolved");
	rdma_ack_cm_event(ev);

	struct ibv_pd *mypd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = mypd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!cq)
		die("ibv_create_cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
	};
	if (rdma_create_qp(id, mypd, &qa))
		die("rdma_create_qp");
	static uint8_t buf[LEN];
	struct ibv_mr *m = ibv_reg_mr(mypd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!m)
		die("ibv_reg_mr");
	struct hello h = {MAGIC, (uint32_t)me, (uint32_t)kase};
	struct rdma_conn_param cp = {.private_data = &h, .private_data_len = sizeof(h),
				     .responder_resources = 1, .initiator_depth = 1, .retry_count = 7};
	if (rdma_connect(id, &cp))
		die("rdma_connect");
	ev = wait_event(ec);
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
		fprintf(stderr, "protection: connect: %s\n", rdma_event_str(ev->event));
		exit(2);
	}
	struct info in = {0};
	if (ev->param.conn.private_data_len >= sizeof(in))
		memcpy(&in, ev->param.conn.private_data, sizeof(in));
	rdma_ack_cm_event(ev);
	if (in.magic != MAGIC) {
		fprintf(stderr, "protection: the server sent no region table\n");
		exit(2);
	}

	memset(buf, 0x55, LEN);
	struct ibv_sge s8 = {.addr = (uintptr_t)buf, .length = 8, .lkey = m->lkey};
	struct ibv_sge sall = {.addr = (uintptr_t)buf, .length = LEN, .lkey = m->lkey};
	struct remote own = in.r[me][RW];
	int sent = 1;
	switch (kase) {
	case OWN_WRITE: post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &sall, own.addr, own.rkey); break;
	case OTHER_PD_WRITE:
		post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, in.r[other][RW].addr, in.r[other][RW].rkey);
		break;
	case OTHER_PD_READ:
		memset(buf, 0, LEN);
		post_send(id->qp, IBV_WR_RDMA_READ, 1, &s8, in.r[other][RW].addr, in.r[other][RW].rkey);
		break;
	case DEREG_WRITE:
		post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, in.r[me][DEAD].addr, in.r[me][DEAD].rkey);
		break;
	case INVAL_WRITE: {
		static char inv[] = "inv";
		struct ibv_sge si = {.addr = (uintptr_t)buf, .length = sizeof(inv), .lkey = m->lkey};
		memcpy(buf, inv, sizeof(inv));
		post_send(id->qp, IBV_WR_SEND_WITH_INV, 0, &si, 0, in.r[me][INV].rkey);
		uint64_t w;
		enum ibv_wc_status st = next_status(cq, &w);
		printf("  send with invalidate: %s\n", status_str(st));
		struct ibv_sge s8b = {.addr = (uintptr_t)buf + 8, .length = 8, .lkey = m->lkey};
		memset(buf + 8, 0x55, 8);
		post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8b, in.r[me][INV].addr, in.r[me][INV].rkey);
		break;
	}
	case READONLY_WRITE:
		post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, in.r[me][RO].addr, in.r[me][RO].rkey);
		break;
	case OUT_OF_RANGE_WRITE: post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, own.addr + LEN - 4, own.rkey); break;
	case BELOW_RANGE_WRITE: post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, own.addr - 8, own.rkey); break;
	case WRAPPED_WRITE: post_send(id->qp, IBV_WR_RDMA_WRITE, 1, &s8, UINT64_MAX - 3, own.rkey); break;
	case BAD_LKEY: {
		/* The queue pair's first request: it fails before the stream carried any FPDU of this queue pair
		 * (in soft-rdma, while the first-FPDU hold still keeps the connection's first bytes). */
		struct ibv_sge bad = {.addr = (uintptr_t)buf, .length = 8, .lkey = m->lkey ^ 0x5a5a5a};
		post_send(id->qp, IBV_WR_SEND, 1, &bad, 0, 0);
		break;
	}
	default: sent = 0;
	}
	/* "done" tells the target the access went through (a Send after it, in order on the stream). */
	static char done_msg[] = "done";
	static uint8_t dbuf[8];
	memcpy(dbuf, done_msg, sizeof(done_msg));
	struct ibv_mr *dm = ibv_reg_mr(mypd, dbuf, sizeof(dbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!dm)
		die("ibv_reg_mr (done)");
	struct ibv_sge sd = {.addr = (uintptr_t)dbuf, .length = sizeof(done_msg), .lkey = dm->lkey};
	post_send(id->qp, IBV_WR_SEND, 2, &sd, 0, 0);
	enum ibv_wc_status st1 = IBV_WC_SUCCESS, st2 = IBV_WC_SUCCESS;
	uint64_t w;
	for (int i = 0; i < 1 + sent; i++) {
		enum ibv_wc_status st = next_status(cq, &w);
		if (st == NO_COMPLETION) {
			/* Nothing more came: neither request completed if it was the first wait. */
			if (i == 0 && sent)
				st1 = st;
			st2 = st;
			break;
		}
		if (w == 1)
			st1 = st;
		else
			st2 = st;
		if (kase == WRAPPED_WRITE && i == 0 && w == 2)
			break; /* the Write was refused at its post */
	}
	/* The requester's event: IBV_EVENT_QP_FATAL after its own local protection error (siw_qp_sq_proc_tx),
	 * none for the peer's Terminate. */
	char event[96], how[300];
	int event_ok = check_events(id->verbs, id->qp, kase == BAD_LKEY ? IBV_EVENT_QP_FATAL : NONE, event,
				    sizeof(event));
	snprintf(how, sizeof(how), "access: %s, then \"done\": %s, %s", status_str(st1),
		 status_str(st2), event);
	if (kase == BAD_LKEY) {
		/* The Send behind the failed one is flushed; kernel siw 6.1 leaves it uncompleted instead (its
		 * connection dropped, siw_qp_sq_proc_tx → siw_qp_cm_drop), which is accepted on siw alone. */
		int siw = !strncmp(ibv_get_device_name(id->verbs->device), "siw", 3);
		int flushed = st2 == IBV_WC_WR_FLUSH_ERR || (siw && st2 == NO_COMPLETION);
		int pass = (st1 == IBV_WC_LOC_PROT_ERR || st1 == IBV_WC_LOC_QP_OP_ERR) && flushed;
		verdict(kase, me, pass && event_ok, how);
	} else if (kase == OTHER_PD_READ) {
		int leaked = 0;
		for (int i = 0; i < 8; i++)
			leaked |= buf[i] != 0;
		verdict(kase, me, st1 != IBV_WC_SUCCESS && !leaked && event_ok, how);
	} else {
		/* The target judges; the requester's view is printed (and an unexpected event fails it). */
		printf("  client %d %s: %s%s\n", me, case_name[kase], how, event_ok ? "" : ": UNEXPECTED EVENT");
		if (!event_ok)
			failures++;
	}
	/* A connection the target ended (a refused access) is over already: disconnect only one that is not,
	 * so that no rdma_disconnect races the provider's own drop (kernel siw 6.1 then reports the close
	 * twice: see the target's teardown in `serve`). */
	if (!disconnected_in_time(ec, 500)) {
		rdma_disconnect(id);
		wait_disconnected(ec);
	}
	rdma_destroy_qp(id);
	ibv_dereg_mr(dm);
	ibv_dereg_mr(m);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(mypd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ec);
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(argv[2], atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "client")) {
		int me = atoi(argv[4]) ? 1 : 0;
		for (int k = 0; k < NCASES; k++)
			one_case(argv[2], argv[3], me, k);
		return failures ? 1 : 0;
	}
	fprintf(stderr, "usage: protection server PORT CONNECTIONS | protection client HOST PORT ID\n");
	return 2;
}
