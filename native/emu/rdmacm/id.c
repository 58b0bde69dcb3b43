/* Emulated librdmacm: event channels, ids and events.
 *
 * A channel's fd is an eventfd in semaphore mode holding one count per queued
 * event, so it polls readable exactly while events wait, a blocking
 * rdma_get_cm_event sleeps in read() and an O_NONBLOCK channel (what
 * libfabric sets) returns EAGAIN, as with /dev/infiniband/rdma_cm.  Events
 * are processed when they are retrieved, as librdmacm does: a
 * CONNECT_RESPONSE on an id with a QP moves the QP to RTR/RTS, sends the RTU
 * and becomes ESTABLISHED.  An id is freed when it is destroyed and every
 * event reported on it has been acked (real rdma_destroy_id blocks instead). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "cma.h"

/* ---- channels ------------------------------------------------------------------ */
static struct cm_channel *channel_new(int sync)
{
	struct cm_channel *ch = calloc(1, sizeof *ch);
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ch.fd < 0) {
		free(ch);
		return NULL;
	}
	ch->sync = sync;
	return ch;
}

static void event_free(struct cm_event *e)
{
	struct cm_id *owner = e->owner;
	free(e);
	if (owner) {
		owner->events_out--;
		cma_id_maybe_free(owner);
	}
}

/* Remove the queued events of a channel that `pred` selects, then run `each`
 * on them and free them (unlinked first: `each` may drop more events from the
 * same channel).  Lock held. */
static void channel_drop(struct cm_channel *ch, int (*pred)(struct cm_event *, void *), void *arg,
			 void (*each)(struct cm_event *))
{
	struct cm_event **pp = &ch->head, *last = NULL, *gone = NULL, **gone_tail = &gone;
	while (*pp) {
		struct cm_event *e = *pp;
		if (pred(e, arg)) {
			*pp = e->next;
			e->next = NULL;
			*gone_tail = e;
			gone_tail = &e->next;
		} else {
			last = e;
			pp = &e->next;
		}
	}
	ch->tail = last;
	while (gone) {
		struct cm_event *e = gone;
		gone = e->next;
		if (each)
			each(e);
		event_free(e);
	}
}

static int pred_all(struct cm_event *e, void *arg) { (void)e; (void)arg; return 1; }
static int pred_owner(struct cm_event *e, void *arg) { return e->owner == arg; }

/* A connect request nobody will retrieve: reject it and free its child id
 * with whatever else was queued for the child. */
static void drop_conn_request(struct cm_event *e)
{
	if (e->ev.event != RDMA_CM_EVENT_CONNECT_REQUEST || !e->target)
		return;
	struct cm_id *child = e->target;
	e->target = NULL;
	child->destroyed = 1;
	child->events_out++;   /* held while its events go */
	cma_destroy_conn(child);
	if (child->id.channel)
		channel_drop(to_cch(child->id.channel), pred_owner, child, NULL);
	child->events_out--;
	cma_id_maybe_free(child);
}

CMA_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	if (cma_init())
		return NULL;
	struct cm_channel *ch = channel_new(0);
	return ch ? &ch->ch : NULL;
}

CMA_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (!channel)
		return;
	struct cm_channel *ch = to_cch(channel);
	pthread_mutex_lock(&cma.lock);
	/* the ids still on it go with it, as when the kernel releases an rdma_cm
	 * file: peers are told, listeners stop, ports are released */
	for (struct cm_id *c = cma.ids; c; c = c->next)
		if (c->id.channel == channel && !c->destroyed) {
			cma_destroy_conn(c);
			c->state = CS_CLOSED;
			c->bound = 0;
			c->timer = CT_NONE;
			c->id.channel = NULL;
		}
	channel_drop(ch, pred_all, NULL, drop_conn_request);
	pthread_mutex_unlock(&cma.lock);
	close(ch->ch.fd);
	free(ch);
}

/* ---- events ---------------------------------------------------------------------- */
struct cm_event *cma_event_new(struct cm_id *target, struct cm_id *owner, int type, int status)
{
	struct cm_event *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->target = target;
	e->owner = owner;
	e->ev.id = &target->id;
	e->ev.event = (enum rdma_cm_event_type)type;
	e->ev.status = status;
	return e;
}

void cma_event_post(struct cm_event *e)
{
	if (!e->owner->id.channel) {   /* its channel was destroyed: nobody can read it */
		free(e);
		return;
	}
	struct cm_channel *ch = to_cch(e->owner->id.channel);
	e->owner->events_out++;
	e->next = NULL;
	if (ch->tail)
		ch->tail->next = e;
	else
		ch->head = e;
	ch->tail = e;
	uint64_t one = 1;
	if (write(ch->ch.fd, &one, sizeof one) != sizeof one)
		CMA_LOG("event channel fd %d: cannot count an event (%s)", ch->ch.fd, strerror(errno));
	CMA_LOG("event %s status %d on id %p", rdma_event_str(e->ev.event), e->ev.status, (void *)e->ev.id);
}

void cma_queue_event(struct cm_id *c, int type, int status)
{
	struct cm_event *e = cma_event_new(c, c, type, status);
	if (e)
		cma_event_post(e);
}

/* What librdmacm does with an event when the application retrieves it. */
static void process_event(struct cm_event *e)
{
	struct cm_id *c = e->target;
	switch (e->ev.event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		if (e->owner->sync) {   /* children of a synchronous listener are synchronous */
			struct cm_channel *ch = channel_new(1);
			if (ch) {
				c->id.channel = &ch->ch;
				c->sync = 1;
			}
		}
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		if (c->id.qp) {
			e->ev.status = cma_process_conn_resp(c);
			e->ev.event = e->ev.status ? RDMA_CM_EVENT_CONNECT_ERROR : RDMA_CM_EVENT_ESTABLISHED;
			c->connect_error = e->ev.status != 0;
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
		cma_modify_qp_err(c);
		break;
	default:
		break;
	}
}

CMA_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	if (cma_init())
		return -1;
	if (!channel || !event)
		return cma_err(EINVAL);
	struct cm_channel *ch = to_cch(channel);
	for (;;) {
		uint64_t v;
		ssize_t r = read(ch->ch.fd, &v, sizeof v);
		if (r != (ssize_t)sizeof v)
			return r >= 0 ? cma_err(ENODATA) : -1;
		pthread_mutex_lock(&cma.lock);
		struct cm_event *e = ch->head;
		if (!e) {   /* its event was dropped or migrated: wait for the next */
			pthread_mutex_unlock(&cma.lock);
			continue;
		}
		ch->head = e->next;
		if (!ch->head)
			ch->tail = NULL;
		e->next = NULL;
		if (e->target && e->target->connect_error &&
		    (e->ev.event == RDMA_CM_EVENT_REJECTED || e->ev.event == RDMA_CM_EVENT_DISCONNECTED)) {
			/* after a CONNECT_ERROR, librdmacm drops the id's REJECTED/DISCONNECTED */
			event_free(e);
			pthread_mutex_unlock(&cma.lock);
			continue;
		}
		process_event(e);
		CMA_LOG("get_cm_event %s status %d id %p", rdma_event_str(e->ev.event), e->ev.status, (void *)e->ev.id);
		pthread_mutex_unlock(&cma.lock);
		*event = &e->ev;
		return 0;
	}
}

CMA_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma.lock);
	event_free((struct cm_event *)event);
	pthread_mutex_unlock(&cma.lock);
	return 0;
}

CMA_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR", "RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR", "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE", "RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED", "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	return (unsigned)event < sizeof names / sizeof names[0] ? names[event] : "UNKNOWN EVENT";
}

/* Synchronous ids (created without a channel): every call that completes
 * with an event waits for it on the private channel, keeps it in id->event
 * and turns a failure into errno, as librdmacm's ucma_complete. */
int cma_complete(struct rdma_cm_id *id)
{
	struct cm_id *c = to_cid(id);
	if (!c->sync)
		return 0;
	if (id->event) {
		rdma_ack_cm_event(id->event);
		id->event = NULL;
	}
	if (rdma_get_cm_event(id->channel, &id->event))
		return -1;
	int st = id->event->status;
	if (!st)
		return 0;
	if (id->event->event == RDMA_CM_EVENT_REJECTED)
		return cma_err(ECONNREFUSED);
	return cma_err(st < 0 ? -st : st);
}

/* ---- ids ---------------------------------------------------------------------------- */
struct cm_id *cma_id_alloc(struct cm_channel *ch, void *context, enum rdma_port_space ps, enum ibv_qp_type qpt)
{
	struct cm_id *c = calloc(1, sizeof *c);
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	if (!ch) {
		ch = channel_new(1);
		if (!ch) {
			free(c);
			return NULL;
		}
		c->sync = 1;
	}
	c->id.channel = &ch->ch;
	c->id.context = context;
	c->id.ps = ps;
	c->id.qp_type = qpt;
	c->sock = -1;
	c->local_psn = (uint32_t)random() & 0xffffff;
	c->next = cma.ids;
	cma.ids = c;
	return c;
}

void cma_set_verbs(struct cm_id *c)
{
	c->id.verbs = cma.ctx;
	c->id.pd = cma.pd;
	c->id.port_num = 1;
}

void cma_close_sock(struct cm_id *c)
{
	if (c->sock >= 0) {
		close(c->sock);
		c->sock = -1;
	}
}

void cma_id_maybe_free(struct cm_id *c)
{
	if (!c->destroyed || c->events_out > 0)
		return;
	for (struct cm_id **pp = &cma.ids; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	cma_close_sock(c);
	if (c->sync) {
		struct cm_channel *ch = to_cch(c->id.channel);
		channel_drop(ch, pred_all, NULL, drop_conn_request);
		close(ch->ch.fd);
		free(ch);
	}
	free(c->ep_qp_attr);
	free(c);
}

CMA_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			      enum rdma_port_space ps)
{
	if (cma_init())
		return -1;
	if (!id)
		return cma_err(EINVAL);
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB)
		return cma_err(EINVAL);
	enum ibv_qp_type qpt = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
	pthread_mutex_lock(&cma.lock);
	struct cm_id *c = cma_id_alloc(channel ? to_cch(channel) : NULL, context, ps, qpt);
	pthread_mutex_unlock(&cma.lock);
	if (!c)
		return -1;
	*id = &c->id;
	return 0;
}

CMA_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	if (!id)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	if (c->destroyed) {
		pthread_mutex_unlock(&cma.lock);
		return cma_err(EINVAL);
	}
	c->destroyed = 1;
	c->events_out++;   /* held until the end: dropping its events must not free it yet */
	cma_destroy_conn(c);
	c->bound = 0;
	c->timer = CT_NONE;
	/* events not yet retrieved go with it (connect requests are rejected) */
	if (id->channel)
		channel_drop(to_cch(id->channel), pred_owner, c, drop_conn_request);
	struct rdma_cm_event *last = id->event;
	id->event = NULL;
	if (last)
		event_free((struct cm_event *)last);
	c->events_out--;
	cma_id_maybe_free(c);
	pthread_mutex_unlock(&cma.lock);
	return 0;
}

CMA_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	if (!id)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	if (c->sync && !channel)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma.lock);
	struct cm_channel *nw = channel ? to_cch(channel) : channel_new(1);
	if (!nw) {
		pthread_mutex_unlock(&cma.lock);
		return -1;
	}
	struct cm_channel *old = id->channel ? to_cch(id->channel) : NULL;
	if (!old) {   /* its channel was destroyed, and the id with it */
		if (!channel)
			close(nw->ch.fd), free(nw);
		pthread_mutex_unlock(&cma.lock);
		return cma_err(EINVAL);
	}
	/* the id's queued events move with it; their counts on the old fd go stale */
	struct cm_event **pp = &old->head, *last = NULL;
	while (*pp) {
		struct cm_event *e = *pp;
		if (e->owner != c) {
			last = e;
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->target)
			e->target->id.channel = &nw->ch;
		c->events_out--;       /* re-counted by the post below */
		id->channel = &nw->ch;
		cma_event_post(e);
	}
	old->tail = last;
	int was_sync = c->sync;
	id->channel = &nw->ch;
	c->sync = channel == NULL;
	if (was_sync) {
		struct rdma_cm_event *ev = id->event;
		id->event = NULL;
		channel_drop(old, pred_all, NULL, drop_conn_request);
		close(old->ch.fd);
		free(old);
		if (ev)
			event_free((struct cm_event *)ev);
	}
	pthread_mutex_unlock(&cma.lock);
	return 0;
}

CMA_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (!id || !optval)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	int r = 0;
	if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_TOS && optlen == sizeof(uint8_t))
		c->tos = *(uint8_t *)optval;
	else if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_REUSEADDR && optlen == sizeof(int))
		c->reuseaddr = *(int *)optval != 0;
	else if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_AFONLY && optlen == sizeof(int))
		c->afonly = *(int *)optval != 0;
	else if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT && optlen == sizeof(uint8_t)) {
		c->ack_timeout = *(uint8_t *)optval;
		c->ack_timeout_set = 1;
	} else if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH)
		r = 0;   /* paths are the emulator's: accepted, not used */
	else
		r = cma_err(EINVAL);
	pthread_mutex_unlock(&cma.lock);
	return r;
}

CMA_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	if (cma_init()) {
		if (num_devices)
			*num_devices = 0;
		return NULL;
	}
	struct ibv_context **l = calloc(2, sizeof *l);
	if (!l) {
		errno = ENOMEM;
		if (num_devices)
			*num_devices = 0;
		return NULL;
	}
	l[0] = cma.ctx;
	if (num_devices)
		*num_devices = 1;
	return l;
}

CMA_EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);   /* the contexts stay open, as with rdma-core */
}
