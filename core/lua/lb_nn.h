/* lb_nn.h — what lb_nn.c shares with lb_exec.c: the luapipe.Tensor and
 * luapipe.Layer boxes and the Lua data-source adapter. */
#pragma once

#include "lb_internal.h"
#include "lp_exec.h"
#include "lp_nn.h"
#include "lp_tensor.h"

#define LB_TENSOR "luapipe.Tensor"
#define LB_LAYER "luapipe.Layer"
#define LB_OPTIM "luapipe.Optim"

/* The tensor / layer inside the box at idx (raises when closed or not one). */
lp_tensor *lb_check_tensor(lua_State *L, int idx);
lp_nn_layer *lb_check_layer(lua_State *L, int idx);
/* Pushes a new box owning one reference of l. */
void lb_push_layer(lua_State *L, lp_nn_layer *l);

/* A Lua function data(step, mb) -> input, target (luapipe.Tensor each),
 * called through the pcall choke point; `ref` is a registry reference. */
typedef struct lb_data {
  lua_State *L;
  int ref;
} lb_data;
/* lp_exec_data_fn over an lb_data (ud). Gives new views of the tensors. */
lp_status lb_data_call(void *ud, int64_t step, int mb, lp_tensor **input,
                       lp_tensor **target, char *err);

/* Reads optimizer options {kind = "sgd"|"adamw", lr =, momentum =,
 * weight_decay =, beta1 =, beta2 =, eps =} at idx (nil: SGD lr 0.01). */
void lb_optim_opts(lua_State *L, int idx, lp_nn_optim_type *kind,
                   lp_nn_sgd_opts *sgd, lp_nn_adamw_opts *adamw);

/* The loss kind named by the string at idx (nil: "mse"); raises "<what>
 * must be "mse" or "cross_entropy", got ..." for another name. */
lp_nn_loss_kind lb_loss_kind(lua_State *L, int idx, const char *what);
