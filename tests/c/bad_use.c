/*
 * bad_use.c: wrong uses of libibverbs/librdmacm, each of which must end in an errno or an error
 * completion, never a crash. Written for soft-rdma's rdma_core_programs suite
 * (tests/tests/rdma_core_programs.rs), which compiles it against the system's rdma-core headers
 * (`cc bad_use.c -libverbs -lrdmacm`) and runs it through `soft-rdma run`, so that it binds to soft-rdma's
 * drop-in libraries.
 *
 * Usage: bad_use CASE [ADDR PORT]. Each case prints one line `CASE: what happened` that the Rust test
 * compares with what rdma-core's providers give (the errno values of the kernel's uverbs and siw, whose
 * transport soft-rdma's device has):
 *
 *   other_context     a QP on a PD of one context with CQs of another: ibv_create_qp fails, EINVAL
 *                     (uverbs looks a handle up in the caller's own context only).
 *   wrong_state       ibv_post_send on a QP never connected (INIT, siw's idle state): ENOTCONN
 *                     (siw_post_send: the SQ takes work only in RTS); ibv_post_recv with more SGEs than the
 *                     QP's max_recv_sge: EINVAL.
 *   after_fork        a child of fork using its parent's context and PD: EIO (soft-rdma's session stays the
 *                     parent's); the child's own ibv_open_device and ibv_alloc_pd then work.
 *   too_many_sges     ibv_create_qp asking for more send SGEs than ibv_query_device's max_sge: EINVAL.
 *   cq_in_use         ibv_destroy_cq of a CQ a QP still uses: EBUSY (uverbs keeps a use count).
 *   unregistered_lkey ADDR PORT: connects (rdma_cm) to `bad_use serve`, posts a Send whose SGE names an lkey
 *                     that was never registered: a completion with IBV_WC_LOC_PROT_ERR; and a Send with more
 *                     SGEs than max_send_sge on the connected QP: EINVAL.
 *   refused           ADDR PORT: connects where nothing listens: RDMA_CM_EVENT_REJECTED with status
 *                     -ECONNREFUSED (iWARP: the peer's TCP reset; cma_iw_handler), and the id stays the
 *                     program's until it destroys it: rdma_destroy_id returns 0 (perftest destroys it so).
 *   serve             ADDR PORT: accepts one connection and waits for its disconnect (the peer of
 *                     unregistered_lkey).
 *   device_fatal      opens the device, prints `device_fatal: ready`, then waits on the async fd; when
 *                     soft-rdmad goes away: IBV_EVENT_DEVICE_FATAL, then ibv_alloc_pd, ibv_create_cq and
 *                     ibv_reg_mr fail with EIO (as uverbs after a device is disassociated).
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static const char *err_name(int e)
{
	static char other[32];

	switch (e) {
	case 0: return "0 (no error)";
	case EINVAL: return "EINVAL";
	case ENOTCONN: return "ENOTCONN";
	case EBUSY: return "EBUSY";
	case EIO: return "EIO";
	case ENODEV: return "ENODEV";
	case ENOMEM: return "ENOMEM";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case ENOSYS: return "ENOSYS";
	case EPERM: return "EPERM";
	case EFAULT: return "EFAULT";
	case EAGAIN: return "EAGAIN";
	case ENOENT: return "ENOENT";
	case ECONNRESET: return "ECONNRESET";
	case EPROTO: return "EPROTO";
	case ETIMEDOUT: return "ETIMEDOUT";
	default:
		snprintf(other, sizeof(other), "errno %d", e);
		return other;
	}
}

/* Prints the line and leaves: one case, one line. */
static void say(const char *c, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void say(const char *c, const char *fmt, ...)
{
	va_list ap;

	printf("%s: ", c);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(0);
}

static struct ibv_context *open_first(const char *c)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx;

	if (!list || n == 0)
		say(c, "SETUP ibv_get_device_list found no device (%s)", err_name(errno));
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		say(c, "SETUP ibv_open_device failed (%s)", err_name(errno));
	ibv_free_device_list(list);
	return ctx;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, int send_sge, int recv_sge)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = send_sge;
	a.cap.max_recv_sge = recv_sge;
	errno = 0;
	return ibv_create_qp(pd, &a);
}

/* The first device's context with a PD and a CQ of 8 entries on it, or the check's SETUP failure. */
static struct ibv_context *pd_and_cq(const char *c, struct ibv_pd **pd, struct ibv_cq **cq)
{
	struct ibv_context *ctx = open_first(c);

	*pd = ibv_alloc_pd(ctx);
	*cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	if (!*pd || !*cq)
		say(c, "SETUP ibv_alloc_pd/ibv_create_cq failed (%s)", err_name(errno));
	return ctx;
}

static void other_context(void)
{
	const char *c = "other_context";
	struct ibv_context *one = open_first(c), *two = open_first(c);
	struct ibv_pd *pd = ibv_alloc_pd(one);
	struct ibv_cq *cq = ibv_create_cq(two, 4, NULL, NULL, 0);
	struct ibv_qp *qp;

	if (!pd || !cq)
		say(c, "SETUP ibv_alloc_pd/ibv_create_cq failed (%s)", err_name(errno));
	qp = rc_qp(pd, cq, 1, 1);
	if (qp)
		say(c, "ibv_create_qp succeeded with a PD of one context and a CQ of another");
	say(c, "ibv_create_qp failed with %s", err_name(errno));
}

static void wrong_state(void)
{
	const char *c = "wrong_state";
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	static char buf[64];
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_sge sge[64];
	struct ibv_send_wr swr, *bad_s = NULL;
	struct ibv_recv_wr rwr, *bad_r = NULL;
	int i, send_rc, recv_rc;

	pd_and_cq(c, &pd, &cq);
	errno = 0;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		say(c, "SETUP ibv_reg_mr of %zu bytes at %p failed (%s)", sizeof(buf), (void *)buf, err_name(errno));
	qp = rc_qp(pd, cq, 1, 1);
	if (!qp)
		say(c, "SETUP ibv_create_qp failed (%s)", err_name(errno));
	if (ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi))
		say(c, "SETUP ibv_query_qp failed (%s)", err_name(errno));
	for (i = 0; i < 64; i++) {
		sge[i].addr = (uintptr_t)buf;
		sge[i].length = 1;
		sge[i].lkey = mr->lkey;
	}
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	send_rc = ibv_post_send(qp, &swr, &bad_s);
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 2;
	rwr.sg_list = sge;
	rwr.num_sge = qi.cap.max_recv_sge + 1;
	recv_rc = rwr.num_sge <= 64 ? ibv_post_recv(qp, &rwr, &bad_r) : -1;
	say(c, "state %s: ibv_post_send returned %s (bad_wr %s); ibv_post_recv with %d SGEs returned %s",
	    qa.qp_state == IBV_QPS_RESET ? "RESET" : qa.qp_state == IBV_QPS_INIT ? "INIT" : "neither RESET nor INIT",
	    err_name(send_rc),
	    bad_s == &swr ? "set" : "not set", rwr.num_sge, err_name(recv_rc));
}

static void too_many_sges(void)
{
	const char *c = "too_many_sges";
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_context *ctx = pd_and_cq(c, &pd, &cq);
	struct ibv_qp *qp;

	if (ibv_query_device(ctx, &da))
		say(c, "SETUP ibv_query_device failed (%s)", err_name(errno));
	qp = rc_qp(pd, cq, da.max_sge + 1, 1);
	if (qp)
		say(c, "ibv_create_qp succeeded with max_send_sge %d > the device's max_sge %d", da.max_sge + 1,
		    da.max_sge);
	say(c, "ibv_create_qp with max_send_sge = max_sge + 1 failed with %s", err_name(errno));
}

static void cq_in_use(void)
{
	const char *c = "cq_in_use";
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int rc, after;

	pd_and_cq(c, &pd, &cq);
	qp = rc_qp(pd, cq, 1, 1);
	if (!qp)
		say(c, "SETUP ibv_create_qp failed (%s)", err_name(errno));
	rc = ibv_destroy_cq(cq);
	if (rc == 0)
		say(c, "ibv_destroy_cq succeeded while a QP uses the CQ");
	/* The CQ must still be whole: the QP goes first, then the CQ. */
	after = ibv_destroy_qp(qp) ? -1 : ibv_destroy_cq(cq);
	say(c, "ibv_destroy_cq returned %s; after ibv_destroy_qp it returned %s", err_name(rc),
	    err_name(after));
}

static void after_fork(void)
{
	const char *c = "after_fork";
	struct ibv_pd *pd, *in_child;
	struct ibv_cq *cq;
	struct ibv_context *ctx = pd_and_cq(c, &pd, &cq), *own;
	static char buf[64];
	struct ibv_mr *mr;
	int status, e_pd, e_mr;
	pid_t child;

	fflush(stdout);
	child = fork();
	if (child < 0)
		say(c, "SETUP fork failed (%s)", err_name(errno));
	if (child > 0) {
		if (waitpid(child, &status, 0) != child || !WIFEXITED(status))
			say(c, "the child did not exit normally (status %d)", status);
		exit(WEXITSTATUS(status));
	}
	errno = 0;
	in_child = ibv_alloc_pd(ctx);
	e_pd = in_child ? 0 : errno;
	errno = 0;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	e_mr = mr ? 0 : errno;
	own = open_first(c);
	errno = 0;
	in_child = ibv_alloc_pd(own);
	say(c, "in the child, the parent's context: ibv_alloc_pd %s; its PD: ibv_reg_mr %s; the child's own "
	    "context: ibv_alloc_pd %s", e_pd ? err_name(e_pd) : "succeeded", e_mr ? err_name(e_mr) : "succeeded",
	    in_child ? "succeeded" : err_name(errno));
}

/* The next CM event on `ch` (5 s at most), acked; its type, or -1. */
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_id **id, int *status)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;
	int type;

	if (poll(&p, 1, 5000) != 1 || rdma_get_cm_event(ch, &e))
		return -1;
	type = e->event;
	if (id)
		*id = e->id;
	if (status)
		*status = e->status;
	rdma_ack_cm_event(e);
	return type;
}

static void expect_event(const char *c, struct rdma_event_channel *ch, int want, struct rdma_cm_id **id)
{
	int status = 0, got = next_event(ch, id, &status);

	if (got != want)
		say(c, "SETUP waited for %s, got %s (status %d)", rdma_event_str(want),
		    got < 0 ? "nothing in 5 s" : rdma_event_str(got), status);
}

static struct rdma_addrinfo *address(const char *c, const char *addr, const char *port, int passive)
{
	struct rdma_addrinfo hints, *res = NULL;

	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_flags = passive ? RAI_PASSIVE : 0;
	if (rdma_getaddrinfo(addr, port, &hints, &res) || !res)
		say(c, "SETUP rdma_getaddrinfo %s:%s failed (%s)", addr, port, err_name(errno));
	return res;
}

static void serve(const char *addr, const char *port)
{
	const char *c = "serve";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = address(c, addr, port, 1);
	struct rdma_cm_id *listen_id, *id = NULL;
	struct ibv_qp_init_attr a;
	struct ibv_pd *pd;
	struct ibv_cq *cq;

	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, ai->ai_src_addr) || rdma_listen(listen_id, 1))
		say(c, "SETUP listening on %s:%s failed (%s)", addr, port, err_name(errno));
	printf("serve: listening\n");
	fflush(stdout);
	{
		int status = 0, got = -1;

		while (got < 0) /* no timeout: the test kills a server nobody connects to */
			got = next_event(ch, &id, &status);
		if (got != RDMA_CM_EVENT_CONNECT_REQUEST)
			say(c, "SETUP waited for a connect request, got %s", rdma_event_str(got));
	}
	pd = ibv_alloc_pd(id->verbs);
	cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (!cq || rdma_create_qp(id, pd, &a) || rdma_accept(id, NULL))
		say(c, "SETUP accepting failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ESTABLISHED, NULL);
	{
		int status = 0, got = -1;

		while (got < 0)
			got = next_event(ch, NULL, &status);
		say(c, "the client's connection ended with %s", rdma_event_str(got));
	}
}

/* Polls `cq` for one completion (5 s at most). */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
		usleep(1000);
	}
}

static void unregistered_lkey(const char *addr, const char *port)
{
	const char *c = "unregistered_lkey";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = address(c, addr, port, 0);
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr a;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	static char buf[4096];
	struct ibv_sge sge[64];
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_wc wc;
	int i, n, many_rc;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 2000))
		say(c, "SETUP rdma_resolve_addr failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	if (rdma_resolve_route(id, 2000))
		say(c, "SETUP rdma_resolve_route failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	pd = ibv_alloc_pd(id->verbs);
	cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	mr = cq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (!mr || rdma_create_qp(id, pd, &a) || rdma_connect(id, NULL))
		say(c, "SETUP connecting failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ESTABLISHED, NULL);
	for (i = 0; i < 64; i++) {
		sge[i].addr = (uintptr_t)buf;
		sge[i].length = 8;
		sge[i].lkey = mr->lkey;
	}
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = sge;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	/* More SGEs than the QP was made with (a.cap.max_send_sge, as ibv_create_qp wrote it back). */
	wr.wr_id = 1;
	wr.num_sge = a.cap.max_send_sge + 1;
	many_rc = wr.num_sge <= 64 ? ibv_post_send(id->qp, &wr, &bad) : -1;
	/* An lkey that no ibv_reg_mr returned: the one registered, with its key byte changed. */
	sge[0].lkey = mr->lkey ^ 0x5a;
	wr.wr_id = 2;
	wr.num_sge = 1;
	bad = NULL;
	if (ibv_post_send(id->qp, &wr, &bad))
		say(c, "ibv_post_send with an unregistered lkey was refused at once (%s), not completed in error",
		    err_name(errno));
	n = poll_one(cq, &wc);
	rdma_disconnect(id);
	if (n < 0)
		say(c, "ibv_poll_cq failed (%d)", n);
	if (n == 0)
		say(c, "no completion in 5 s (too many SGEs: %s)", err_name(many_rc));
	say(c, "too many SGEs: %s; unregistered lkey: wr_id %llu completed with %s (%d)", err_name(many_rc),
	    (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.status);
}

static void refused(const char *addr, const char *port)
{
	const char *c = "refused";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = address(c, addr, port, 0);
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr a;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int status = 0, got, rc;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 2000))
		say(c, "SETUP rdma_resolve_addr failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	if (rdma_resolve_route(id, 2000))
		say(c, "SETUP rdma_resolve_route failed (%s)", err_name(errno));
	expect_event(c, ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	pd = ibv_alloc_pd(id->verbs);
	cq = pd ? ibv_create_cq(id->verbs, 4, NULL, NULL, 0) : NULL;
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (!cq || rdma_create_qp(id, pd, &a) || rdma_connect(id, NULL))
		say(c, "SETUP connecting failed (%s)", err_name(errno));
	got = next_event(ch, NULL, &status);
	rdma_destroy_qp(id);
	errno = 0;
	rc = rdma_destroy_id(id);
	say(c, "%s status %d; rdma_destroy_id returned %d (%s)", got < 0 ? "no event in 5 s" : rdma_event_str(got),
	    status, rc, err_name(rc ? errno : 0));
}

static void device_fatal(void)
{
	const char *c = "device_fatal";
	struct ibv_context *ctx = open_first(c);
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *after;
	struct ibv_async_event ev;
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	static char buf[64];
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	int type, n, e_pd, e_cq, e_mr;

	if (!pd)
		say(c, "SETUP ibv_alloc_pd failed (%s)", err_name(errno));
	printf("%s: ready\n", c);
	fflush(stdout);
	n = poll(&p, 1, 30000);
	if (n != 1)
		say(c, "no async event in 30 s after soft-rdmad went away (poll %d)", n);
	if (ibv_get_async_event(ctx, &ev))
		say(c, "the async fd was readable but ibv_get_async_event failed (%s)", err_name(errno));
	type = ev.event_type;
	ibv_ack_async_event(&ev);
	errno = 0;
	after = ibv_alloc_pd(ctx);
	e_pd = after ? 0 : errno;
	errno = 0;
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	e_cq = cq ? 0 : errno;
	errno = 0;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	e_mr = mr ? 0 : errno;
	say(c, "async event %s; then ibv_alloc_pd %s, ibv_create_cq %s, ibv_reg_mr %s", ibv_event_type_str(type),
	    after ? "succeeded" : err_name(e_pd), cq ? "succeeded" : err_name(e_cq),
	    mr ? "succeeded" : err_name(e_mr));
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(c, "other_context"))
		other_context();
	else if (!strcmp(c, "wrong_state"))
		wrong_state();
	else if (!strcmp(c, "too_many_sges"))
		too_many_sges();
	else if (!strcmp(c, "cq_in_use"))
		cq_in_use();
	else if (!strcmp(c, "after_fork"))
		after_fork();
	else if (!strcmp(c, "device_fatal"))
		device_fatal();
	else if (!strcmp(c, "serve") && argc == 4)
		serve(argv[2], argv[3]);
	else if (!strcmp(c, "unregistered_lkey") && argc == 4)
		unregistered_lkey(argv[2], argv[3]);
	else if (!strcmp(c, "refused") && argc == 4)
		refused(argv[2], argv[3]);
	fprintf(stderr, "usage: bad_use other_context|wrong_state|too_many_sges|cq_in_use|after_fork|device_fatal\n"
			"       bad_use serve|unregistered_lkey|refused ADDR PORT\n");
	return 2;
}
