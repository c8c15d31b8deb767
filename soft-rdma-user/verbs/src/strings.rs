//! The `*_str` helpers of verbs.h (`ibv_wc_status_str`, `ibv_event_type_str`, `ibv_node_type_str`,
//! `ibv_port_state_str`): static NUL-terminated strings with rdma-core's words.
