// Blockwise-scaled FP8 GEMMs for Hopper (sm_90a) from CUTLASS 3.x's warp-specialized
// kernels: TMA loads, wgmma, FP32 promotion of the accumulator at every 128-wide K block,
// where the block scales are applied (CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8).
//
//   y[M, N] (bf16) = (aq * a_s) @ (wq * w_s)^T
//   aq  [M, K] float8_e4m3fn, row-major (leading dimension lda)
//   a_s [M, K/128] float32, outer-dim-major: a_s(m, kb) at a_s[m + kb * ld_as]
//   wq  [N, K] float8_e4m3fn, row-major (ldw)
//   w_s [N/128, K/128] float32, row-major: w_s(nb, kb) at w_s[nb * ld_ws + kb]
//   y   [M, N] bf16 (float32 in the QR_OUT=1 objects, for numerics checks), row-major (ldy)
//
// Both scale layouts are CUTLASS layouts as they are, no copy: the activation scales are
// "MN-major" (consecutive rows adjacent), the weight scales "K-major". Swapped configs
// compute y^T = W A^T: the weight rows sit on the 128-row MMA side and the tokens on the
// narrow 16/32/64-wide N side, so a decode batch of 16 tokens does not pay for a 64- or
// 128-row tile; there the weight (kernel operand A) carries the 128x128 scales K-major and
// the activations (operand B) the 1x128 scales MN-major, and y row-major is the kernel's
// column-major D.
//
// One restriction from CUTLASS: an MN-major scale tile of >= 32 entries is loaded by TMA,
// which needs its leading dimension and row count to be multiples of 4 (16 bytes). Those
// configs (see kAlignedScaleRows below) need `as_rows` (the rows the activation-scale
// layout covers, >= M) and ld_as to be multiples of 4: the Python wrapper copies the scales
// of an M that is not into a padded buffer ([K/128, round4(M)], a few KB). Rows past M
// multiply codes that TMA reads as zeros and are never stored.
//
// The file is compiled once per configuration (-DQR_PART=<id>, each object holding one
// kernel, so the builds run in parallel) and once with -DQR_PART=-1 for the extern "C"
// entry points; the objects are linked into one shared library (cutlass_gemm.py).
//
// Registers and spills of each kernel (ptxas, nvcc 13.0, sm_90a): the comment above CONFIGS in
// cutlass_gemm.py (kept out of this file, whose hash keys the build).

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

// Programmatic dependent launch (qr_cutlass_fp8_gemm's `pdl`): the kernels' producer warps wait
// (griddepcontrol.wait) before their first global load. Enabled here for the sm_90a device pass
// rather than with CUTLASS_ENABLE_GDC_FOR_SM90, which also compiles an early-release hint that
// CUTLASS 4.2's stream-K scheduler does not compile (is_last_tile binds a const member to a
// non-const reference); without that hint the kernels only release their dependents at exit.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUTLASS_GDC_ENABLED
#endif

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

#ifndef QR_PART
#error "compile with -DQR_PART=<config id> (and -DQR_OUT=0 bf16 / 1 float32) or -DQR_PART=-1 (the entry points)"
#endif
#ifndef QR_OUT
#define QR_OUT 0
#endif
#ifndef QR_SOURCE_KEY
#define QR_SOURCE_KEY 0ULL
#endif
#ifndef QR_ABI
#define QR_ABI 0
#endif

namespace qr {

// Status codes beyond cutlass::Status (0 = kSuccess ... 11 = kInvalid).
enum : int {
  kUnknownConfig = 100,
  kWorkspaceTooSmall = 101,
  kBadArgument = 102,
  kRefused = 104,  // CUTLASS's can_implement said no (its adapter reports only kInvalid)
  kCudaErrorBase = 1000,  // 1000 + cudaError_t of the launch
};

enum : int { kNumConfigs = 6 };

// One GEMM call: raw device pointers, sizes, strides in elements.
struct Problem {
  int m, n, k;
  const void* a; long long lda;
  const float* a_s; long long ld_as; int as_rows;
  const void* w; long long ldw;
  const float* w_s; long long ld_ws;
  void* y; long long ldy;
  int splits;  // stream-K configs: 0 heuristic, 1 data-parallel, > 1 split-K into that many
  int device;
  int sm_count;
  int pdl;  // launch with programmatic stream serialization (the kernels wait on the grid before them)
};

enum class Action : int { kRun = 0, kCanImplement = 1, kWorkspace = 2 };

// Defined in the object of config `Id` and output type `Out` (0 bf16, 1 float32); returns a
// status, and the workspace bytes in *bytes.
template <int Id, int Out>
int dispatch(Action action, Problem const& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
             size_t* bytes);

}  // namespace qr

#if QR_PART >= 0

#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/detail/blockwise_scale_layout.hpp"

namespace qr {
using namespace cute;

// A configuration: tile (kernel M x N x K), cluster, mainloop schedule, tile scheduler, and
// whether the kernel computes y^T = W A^T (swap) or y = A W^T.
template <class TileShape_, class ClusterShape_, class KernelSchedule_, class EpilogueSchedule_, class Scheduler_,
          bool kSwap_, class ElementD_>
struct Blockwise {
  static constexpr bool kSwap = kSwap_;
  using TileShape = TileShape_;
  using ElementCode = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  static constexpr int kAlignCode = 16;                    // 16 bytes of e4m3
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));  // 16 bytes of the output

  // Kernel operand A is row-major (K contiguous), operand B "column-major" (K contiguous
  // too): both are the K-major layouts wgmma reads without a transpose.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cute::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  // Scale granularity along the kernel's M / N: the weights' 128 rows and the activations' 1.
  static constexpr int kGranM = kSwap ? 128 : 1;
  static constexpr int kGranN = kSwap ? 1 : 128;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
      kGranM, kGranN, 128, kSwap ? cute::GMMA::Major::K : cute::GMMA::Major::MN,
      kSwap ? cute::GMMA::Major::MN : cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape_,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD,  // no source C
      ElementD, LayoutD, kAlignD, EpilogueSchedule_,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementCode, cute::tuple<LayoutA, LayoutSFA>, kAlignCode,
      ElementCode, cute::tuple<LayoutB, LayoutSFB>, kAlignCode,
      float, TileShape, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, Scheduler_>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr bool kStreamK = cute::is_same_v<Scheduler_, cutlass::gemm::StreamKScheduler>;

  // TMA loads an MN-major scale tile of >= 32 entries (see the file comment).
  static constexpr bool kAlignedScaleRows = (kSwap ? size<1>(TileShape{}) : size<0>(TileShape{})) >= 32;

  // The activation-side (1x128) scale layout: ((1, rows), (128, K blocks), 1), MN-major.
  static auto activation_scales(Problem const& p) {
    int32_t kb = (p.k + 127) / 128, ld = int32_t(p.ld_as);
    return make_layout(make_shape(make_shape(Int<1>{}, int32_t(p.as_rows)), make_shape(Int<128>{}, kb), int32_t(1)),
                       make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, ld), ld * kb));
  }
  // The weight-side (128x128) scale layout: ((128, N blocks), (128, K blocks), 1), K-major.
  static auto weight_scales(Problem const& p) {
    int32_t kb = (p.k + 127) / 128, nb = (p.n + 127) / 128, ld = int32_t(p.ld_ws);
    return make_layout(make_shape(make_shape(Int<128>{}, nb), make_shape(Int<128>{}, kb), int32_t(1)),
                       make_stride(make_stride(_0{}, ld), make_stride(_0{}, _1{}), ld * nb));
  }

  static typename Gemm::Arguments arguments(Problem const& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA sa{};
    StrideB sb{};
    StrideD sd{};
    LayoutSFA lsfa;
    LayoutSFB lsfb;
    const void *ptr_a, *ptr_b;
    const float *ptr_sfa, *ptr_sfb;
    int km, kn;
    if constexpr (kSwap) {  // kernel A = weights (N x K), B = activations (M x K), D = y^T (N x M)
      km = p.n; kn = p.m;
      get<0>(sa) = p.ldw; get<2>(sa) = p.ldw * p.n;
      get<0>(sb) = p.lda; get<2>(sb) = p.lda * p.m;
      get<1>(sd) = p.ldy; get<2>(sd) = p.ldy * p.m;
      ptr_a = p.w; ptr_b = p.a; ptr_sfa = p.w_s; ptr_sfb = p.a_s;
      lsfa = weight_scales(p);
      lsfb = activation_scales(p);
    } else {  // kernel A = activations, B = weights, D = y
      km = p.m; kn = p.n;
      get<0>(sa) = p.lda; get<2>(sa) = p.lda * p.m;
      get<0>(sb) = p.ldw; get<2>(sb) = p.ldw * p.n;
      get<0>(sd) = p.ldy; get<2>(sd) = p.ldy * p.m;
      ptr_a = p.a; ptr_b = p.w; ptr_sfa = p.a_s; ptr_sfb = p.w_s;
      lsfa = activation_scales(p);
      lsfb = weight_scales(p);
    }
    cutlass::KernelHardwareInfo hw;
    hw.device_id = p.device;
    hw.sm_count = p.sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {km, kn, p.k, 1},
        {static_cast<ElementCode const*>(ptr_a), sa, static_cast<ElementCode const*>(ptr_b), sb,
         ptr_sfa, lsfa, ptr_sfb, lsfb},
        {{}, nullptr, sd, static_cast<ElementD*>(p.y), sd},
        hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (kStreamK) {
      using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
      args.scheduler.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
      if (p.splits == 1) {
        args.scheduler.decomposition_mode = Decomposition::DataParallel;
      } else if (p.splits > 1) {
        args.scheduler.decomposition_mode = Decomposition::SplitK;
        args.scheduler.splits = p.splits;
      } else {
        args.scheduler.decomposition_mode = Decomposition::Heuristic;
      }
    }
    return args;
  }

  static int run(Action action, Problem const& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                 size_t* bytes) {
    if (kAlignedScaleRows && ((p.as_rows % 4) || (p.ld_as % 4))) {
      return int(cutlass::Status::kErrorMisalignedOperand);
    }
    auto args = arguments(p);
    cutlass::Status status = Gemm::can_implement(args);
    if (status == cutlass::Status::kInvalid) return kRefused;
    if (status != cutlass::Status::kSuccess) return int(status);
    // no workspace query here: the stream-K scheduler divides by the SM count, which only a device gives
    if (action == Action::kCanImplement) return 0;
    size_t need = Gemm::get_workspace_size(args);
    if (bytes) *bytes = need;
    if (action != Action::kRun) return 0;
    if (workspace_bytes < need || (need && !workspace)) return kWorkspaceTooSmall;
    Gemm gemm;
    status = gemm.initialize(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) return int(status);
    status = gemm.run(stream, nullptr, p.pdl != 0);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return kCudaErrorBase + int(err);
    return int(status);
  }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingpongEpi = cutlass::epilogue::TmaWarpSpecialized;
using StreamK = cutlass::gemm::StreamKScheduler;
using Persistent = cutlass::gemm::PersistentScheduler;

using Out = cute::conditional_t<QR_OUT == 1, float, cutlass::bfloat16_t>;

// The configurations (ids are the Python side's CONFIGS, cutlass_gemm.py).
template <int Id> struct Config;
// 0-2: swap-AB for decode, 128 weight rows x 16 / 32 / 64 tokens, stream-K / split-K over K.
using One = Shape<_1, _1, _1>;
template <> struct Config<0> : Blockwise<Shape<_128, _16, _128>, One, Coop, CoopEpi, StreamK, true, Out> {};
template <> struct Config<1> : Blockwise<Shape<_128, _32, _128>, One, Coop, CoopEpi, StreamK, true, Out> {};
template <> struct Config<2> : Blockwise<Shape<_128, _64, _128>, One, Coop, CoopEpi, StreamK, true, Out> {};
// 3: swap-AB, 128 weight rows x 128 tokens (M 64-256 where N is small), stream-K.
template <> struct Config<3> : Blockwise<Shape<_128, _128, _128>, One, Coop, CoopEpi, StreamK, true, Out> {};
// 4: 64 token rows x 128 weight rows, ping-pong (each warpgroup its own tile), M 64-256.
template <> struct Config<4> : Blockwise<Shape<_64, _128, _128>, One, Pingpong, PingpongEpi, Persistent, false, Out> {};
// 5: 128 x 128 tokens x weight rows, cluster 1x2 (activation tile multicast), stream-K: large M.
template <> struct Config<5>
    : Blockwise<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Coop, CoopEpi, StreamK, false, Out> {};

template <int Id, int OutId>
int dispatch(Action action, Problem const& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
             size_t* bytes) {
  return Config<Id>::run(action, p, workspace, workspace_bytes, stream, bytes);
}

template int dispatch<QR_PART, QR_OUT>(Action, Problem const&, void*, size_t, cudaStream_t, size_t*);

}  // namespace qr

#else  // QR_PART < 0: the entry points

namespace qr {
#define QR_EXTERN(id)                                                                                  \
  extern template int dispatch<id, 0>(Action, Problem const&, void*, size_t, cudaStream_t, size_t*); \
  extern template int dispatch<id, 1>(Action, Problem const&, void*, size_t, cudaStream_t, size_t*);
QR_EXTERN(0)
QR_EXTERN(1)
QR_EXTERN(2)
QR_EXTERN(3)
QR_EXTERN(4)
QR_EXTERN(5)

static int sm_count(int device) {
  static int counts[64] = {0};  // benign race: every writer stores the same value
  if (device < 0 || device >= 64) return 0;
  if (!counts[device]) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    counts[device] = value;
  }
  return counts[device];
}

static int call(int config, int out, Action action, Problem& p, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, size_t* bytes) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.lda < p.k || p.ldw < p.k || p.ldy < p.n || p.as_rows < p.m ||
      p.ld_as < p.as_rows || p.ld_ws < (p.k + 127) / 128 || p.splits < 0) {
    return kBadArgument;
  }
  if (action == Action::kRun) {  // the launch goes to p.device (this library's runtime may have another current)
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err == cudaSuccess && current != p.device) err = cudaSetDevice(p.device);
    if (err != cudaSuccess) return kCudaErrorBase + int(err);
  }
  // the stream-K grid and workspace depend on the SM count; can_implement needs no device
  p.sm_count = action == Action::kCanImplement ? 0 : sm_count(p.device);
  if (action != Action::kCanImplement && p.sm_count <= 0) return kCudaErrorBase + int(cudaErrorNoDevice);
  if (out != 0 && out != 1) return kUnknownConfig;
#define QR_CASE(id) \
  case id: return out ? dispatch<id, 1>(action, p, workspace, workspace_bytes, stream, bytes) \
                      : dispatch<id, 0>(action, p, workspace, workspace_bytes, stream, bytes);
  switch (config) {
    QR_CASE(0)
    QR_CASE(1)
    QR_CASE(2)
    QR_CASE(3)
    QR_CASE(4)
    QR_CASE(5)
    default: return kUnknownConfig;
  }
#undef QR_CASE
}

static Problem problem(int m, int n, int k, const void* a, long long lda, const float* a_s, long long ld_as,
                       int as_rows, const void* w, long long ldw, const float* w_s, long long ld_ws, void* y,
                       long long ldy, int splits, int device) {
  return Problem{m, n, k, a, lda, a_s, ld_as, as_rows, w, ldw, w_s, ld_ws, y, ldy, splits, device, 0, 0};
}

}  // namespace qr

extern "C" {

int qr_cutlass_num_configs() { return qr::kNumConfigs; }

// Which build this is: the ABI of these entry points and the hash of the source (cutlass_build.py).
int qr_cutlass_abi_version() { return QR_ABI; }
unsigned long long qr_cutlass_source_key() { return QR_SOURCE_KEY; }

// y = (a * a_s) @ (w * w_s)^T on `stream`; 0 or a status (qr_cutlass_status_string). `pdl`: a programmatic
// dependent launch (built with CUTLASS_ENABLE_GDC_FOR_SM90, the kernel's loads wait for the grid before it, so it
// may be scheduled while that grid finishes; without a prerequisite grid the wait returns at once).
int qr_cutlass_fp8_gemm(int config, int out, int m, int n, int k, const void* a, long long lda, const float* a_s,
                        long long ld_as, int as_rows, const void* w, long long ldw, const float* w_s,
                        long long ld_ws, void* y, long long ldy, int splits, int device, void* workspace,
                        size_t workspace_bytes, void* stream, int pdl) {
  qr::Problem p = qr::problem(m, n, k, a, lda, a_s, ld_as, as_rows, w, ldw, w_s, ld_ws, y, ldy, splits, device);
  p.pdl = pdl;
  return qr::call(config, out, qr::Action::kRun, p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream),
                  nullptr);
}

// 0 when `config` runs this problem (pointers are only checked for alignment), else why not.
int qr_cutlass_can_implement(int config, int out, int m, int n, int k, const void* a, long long lda, const float* a_s,
                             long long ld_as, int as_rows, const void* w, long long ldw, const float* w_s,
                             long long ld_ws, void* y, long long ldy, int splits, int device) {
  qr::Problem p = qr::problem(m, n, k, a, lda, a_s, ld_as, as_rows, w, ldw, w_s, ld_ws, y, ldy, splits, device);
  return qr::call(config, out, qr::Action::kCanImplement, p, nullptr, 0, nullptr, nullptr);
}

// The workspace bytes of this problem in *bytes (stream-K / split-K partials); 0 or a status.
int qr_cutlass_workspace_size(int config, int out, int m, int n, int k, long long lda, long long ld_as, int as_rows,
                              long long ldw, long long ld_ws, long long ldy, int splits, int device,
                              size_t* bytes) {
  *bytes = 0;
  qr::Problem p = qr::problem(m, n, k, nullptr, lda, nullptr, ld_as, as_rows, nullptr, ldw, nullptr, ld_ws,
                              nullptr, ldy, splits, device);
  return qr::call(config, out, qr::Action::kWorkspace, p, nullptr, 0, nullptr, bytes);
}

const char* qr_cutlass_status_string(int status) {
  switch (status) {
    case qr::kUnknownConfig: return "unknown config id";
    case qr::kWorkspaceTooSmall: return "workspace missing or too small (ask qr_cutlass_workspace_size)";
    case qr::kBadArgument: return "bad sizes or leading dimensions";
    case qr::kRefused:
      return "refused by CUTLASS's can_implement (TMA needs K, the leading dimensions and N 16-byte aligned)";
    default: break;
  }
  if (status >= qr::kCudaErrorBase) return cudaGetErrorString(cudaError_t(status - qr::kCudaErrorBase));
  return cutlassGetStatusString(cutlass::Status(status));
}

}  // extern "C"

#endif
