/* GENERATED stubs: libmlx5 entry points the emulator does not implement.
 * They exist so that binaries linked with BIND_NOW against rdma-core
 * (perftest) load; each fails with EOPNOTSUPP.  Return kinds were taken from
 * the prototypes in the installed <infiniband/mlx5dv.h>. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#define EXPORT __attribute__((visibility("default")))

EXPORT void *mlx5dv_alloc_dm(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_create_mkey(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_destroy_mkey(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_action_create_dest_ibv_qp(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_dest_table(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_dest_vport(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_drop(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_flow_counter(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_modify_header(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_packet_reformat(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_tag(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_action_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_domain_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_domain_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dr_domain_sync(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_matcher_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_matcher_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_rule_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_rule_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_table_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_table_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_devx_create_event_channel(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void mlx5dv_devx_destroy_event_channel(void) { }
EXPORT int mlx5dv_devx_get_event(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_subscribe_devx_event(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_subscribe_devx_event_fd(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_alloc_var(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_flow_meter(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_action_modify_flow_meter(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dump_dr_domain(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dump_dr_matcher(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dump_dr_rule(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dump_dr_table(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void mlx5dv_free_var(void) { }
EXPORT void *mlx5dv_pp_alloc(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void mlx5dv_pp_free(void) { }
EXPORT void *mlx5dv_dr_action_create_default_miss(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void mlx5dv_dr_domain_set_reclaim_device_memory(void) { }
EXPORT int mlx5dv_modify_qp_lag_port(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_query_qp_lag_port(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_action_create_dest_devx_tir(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_dest_array(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_flow_sampler(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_aso(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_pop_vlan(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_dr_action_create_push_vlan(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_action_modify_aso(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_modify_qp_sched_elem(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_modify_qp_udp_sport(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_sched_leaf_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_sched_leaf_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_sched_leaf_modify(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_sched_node_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_sched_node_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_sched_node_modify(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_reserved_qpn_alloc(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_reserved_qpn_dealloc(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int _mlx5dv_query_port(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dm_map_op_addr(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_set_context_attr(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int _mlx5dv_mkey_check(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void mlx5dv_dr_domain_allow_duplicate_rules(void) { }
EXPORT int mlx5dv_map_ah_to_qp(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_qp_cancel_posted_send_wrs(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_crypto_login(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_crypto_login_query_state(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_crypto_logout(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dci_stream_id_reset(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dek_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dek_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dek_query(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_action_create_dest_ib_port(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_dr_matcher_set_layout(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_get_vfio_device_list(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_vfio_get_events_fd(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_vfio_process_events(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dr_aso_other_domain_link(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_dr_aso_other_domain_unlink(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_devx_alloc_msi_vector(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_devx_create_eq(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_devx_destroy_eq(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_free_msi_vector(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_create_steering_anchor(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_crypto_login_create(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_crypto_login_destroy(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_crypto_login_query(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_destroy_steering_anchor(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_dr_action_create_dest_root_table(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_create_wq(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_get_clock_info(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_create_flow_action_esp(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_create_flow(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_create_flow_matcher(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_destroy_flow_matcher(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_create_flow_action_modify_header(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void *mlx5dv_create_flow_action_packet_reformat(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT int mlx5dv_devx_ind_tbl_modify(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_ind_tbl_query(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_srq_modify(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_srq_query(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_wq_modify(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_wq_query(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT void *mlx5dv_devx_create_cmd_comp(void) { errno = EOPNOTSUPP; return NULL; }
EXPORT void mlx5dv_devx_destroy_cmd_comp(void) { }
EXPORT int mlx5dv_devx_get_async_cmd_comp(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_obj_query_async(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
