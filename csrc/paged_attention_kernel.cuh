// The CUDA paged-attention kernel: tensor-core tiles over a paged KV cache, with the query
// rows of one sequence and the GQA group of one KV head in a single tile, so each KV head's
// keys and values are read once however many query rows (decode 1, verify k + 1) share them.
//
// Grid: one program per (sequence b, KV head h, chunk program c, KV split s), flattened.
// A program walks the row chunks c, c + C, c + 2C, ... of sequence b (a chunk = kRows tile
// rows = R query rows x group heads, R = kRows / group), and for each chunk the key tiles of
// split s of the chunk's visible key range, kTileKeys = 64 keys per tile. Each of the four
// warps owns 16 keys of every tile: it copies their K and V rows into its own slice of
// kAttentionStages shared-memory stages by cp.async (zero-filled where a key is missing),
// and alone reads them (S = Q K^T and O += P V with mma.m16n8k16 on ldmatrix fragments,
// online softmax in base 2), so a tile needs no block barrier. The warps merge their
// partial results through shared memory at the end of the chunk. With one split the
// program writes out (and lse); with several it writes a float32 partial output and its
// natural-log LSE, merged by merge_splits_kernel.
//
// Bytes: the visible keys' K and V rows of head h once per chunk (once for decode and
// verify whenever q_len * group <= kRows), the query rows in, the output rows out.
#pragma once
#include <cstdint>

#include "mma_sm80.cuh"

namespace specops {

struct PagedAttentionParams {
  void* out;                    // [Q, Hq, D] dtype of query (one split)
  float* lse;                   // [Q, Hq] or null (one split)
  float* partial_out;           // [S, Q, Hq, D] (several splits)
  float* partial_lse;           // [S, Q, Hq] natural log (several splits)
  const uint16_t* query;        // [Q, Hq, D]
  const uint16_t* key_cache;    // [num_blocks, block_size, Hkv, D]
  const uint16_t* value_cache;  // [num_blocks, block_size, Hkv, D]
  const int32_t* block_table;   // [B, max_blocks]
  const int32_t* seq_lens;      // [B]
  const int32_t* cu_query_lens; // [B + 1]
  float scale;                  // multiplies q . k
  float soft_cap;               // 0 = off
  int sliding_window;           // 0 = off
  int num_query_tokens;         // Q
  int num_heads;                // Hq
  int num_kv_heads;             // Hkv
  int group;                    // Hq / Hkv, <= kRows
  int num_blocks;               // blocks in each cache
  int block_size;               // tokens per block
  int block_shift;              // log2(block_size) when a power of two, else -1
  int max_blocks;               // columns of block_table
  int batch;                    // B
  int num_chunk_programs;       // C
  int num_splits;               // S
};

constexpr int kAttentionWarps = 4;
constexpr int kAttentionThreads = 32 * kAttentionWarps;
constexpr int kWarpKeys = 16;                          // keys a warp owns in each tile
constexpr int kTileKeys = kWarpKeys * kAttentionWarps;
constexpr int kAttentionStages = 3;                    // tiles in shared memory per program
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory layout of one program (bytes). 16-bit rows are padded by 8 elements (16
// bytes) and float rows by 8 floats, so the 8 rows an ldmatrix reads (or the fragment
// stores of the merge) hit distinct banks. The merge's float rows reuse the key stages,
// which are idle by then.
template <int kHeadDim, int kMTiles>
struct AttentionSmem {
  static constexpr int kRows = 16 * kMTiles;
  static constexpr int kStride = kHeadDim + 8;        // 16-bit elements per Q/K/V row
  static constexpr int kOutStride = kHeadDim + 8;     // floats per merge row
  static constexpr int kQueryBytes = kRows * kStride * 2;
  static constexpr int kTileBytes = kTileKeys * kStride * 2;  // one stage of K (or V)
  static constexpr int kQuery = 0;
  static constexpr int kKeys = kQuery + kQueryBytes;
  static constexpr int kValues = kKeys + kAttentionStages * kTileBytes;
  static constexpr int kOut = kKeys;                                   // after the last tile
  static constexpr int kWarpMax = kValues + kAttentionStages * kTileBytes;  // [warps, rows] float
  static constexpr int kWarpSum = kWarpMax + kAttentionWarps * kRows * 4;
  static constexpr int kRowMax = kWarpSum + kAttentionWarps * kRows * 4;  // [rows] float
  static constexpr int kRowSum = kRowMax + kRows * 4;
  static constexpr int kBytes = kRowSum + kRows * 4;
  static_assert(kKeys % 16 == 0 && kValues % 16 == 0 && (kStride * 2) % 16 == 0, "16-byte aligned rows");
  static_assert(kRows * kOutStride * 4 <= 2 * kAttentionStages * kTileBytes, "merge rows fit in the stages");
};

// Query fragments held in registers for the whole chunk when they are few (a decode or
// verify tile at head dim <= 128); otherwise read from shared memory at every tile.
template <int kHeadDim, int kMTiles>
constexpr bool kQueryInRegisters = kMTiles * kHeadDim <= 128;

// kCapOrWindow: compiled with the logit soft-cap and the sliding window (either may still be
// off at run time); without, every element's mask and scale skip both.
template <typename Element, int kHeadDim, int kMTiles, bool kCapOrWindow>
__global__ void __launch_bounds__(kAttentionThreads)
    paged_attention_kernel(const PagedAttentionParams p) {
  using Smem = AttentionSmem<kHeadDim, kMTiles>;
  constexpr int kRows = Smem::kRows;
  constexpr int kStride = Smem::kStride;
  constexpr int kVecPerRow = kHeadDim / 8;            // 16-byte vectors per row
  constexpr int kNTiles = kHeadDim / 8;               // n8 tiles of the output
  constexpr int kKSteps = kHeadDim / 16;              // k16 steps of Q K^T
  constexpr int kKeysPerCopy = 32 / kVecPerRow;       // keys one warp-wide copy covers
  constexpr int kCopies = kWarpKeys / kKeysPerCopy;   // warp-wide copies per tile (K and V)
  constexpr bool kQueryRegs = kQueryInRegisters<kHeadDim, kMTiles>;
  static_assert(kVecPerRow <= 32 && kWarpKeys % kKeysPerCopy == 0, "a copy covers whole key rows");
  static_assert(16 * kAttentionStages <= 64, "ok_ring holds a 16-bit mask per stage");
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem + Smem::kQuery);
  uint16_t* k_smem = reinterpret_cast<uint16_t*>(smem + Smem::kKeys);
  uint16_t* v_smem = reinterpret_cast<uint16_t*>(smem + Smem::kValues);
  float* o_smem = reinterpret_cast<float*>(smem + Smem::kOut);
  float* warp_max = reinterpret_cast<float*>(smem + Smem::kWarpMax);
  float* warp_sum = reinterpret_cast<float*>(smem + Smem::kWarpSum);
  float* row_max = reinterpret_cast<float*>(smem + Smem::kRowMax);
  float* row_sum = reinterpret_cast<float*>(smem + Smem::kRowSum);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  int64_t program = blockIdx.x;
  const int split = static_cast<int>(program % p.num_splits);
  program /= p.num_splits;
  const int chunk_program = static_cast<int>(program % p.num_chunk_programs);
  program /= p.num_chunk_programs;
  const int h = static_cast<int>(program % p.num_kv_heads);
  const int b = static_cast<int>(program / p.num_kv_heads);

  // The sequence's rows and keys, clamped so that bad values never leave the tensors.
  const int start = min(max(p.cu_query_lens[b], 0), p.num_query_tokens);
  const int end = min(max(p.cu_query_lens[b + 1], start), p.num_query_tokens);
  const int q_len = end - start;
  const int seq_len = min(max(p.seq_lens[b], 0), p.max_blocks * p.block_size);
  const int rows_per_chunk = kRows / p.group;  // R query rows per chunk
  const int num_chunks = (q_len + rows_per_chunk - 1) / rows_per_chunk;
  const int32_t* table_row = p.block_table + static_cast<int64_t>(b) * p.max_blocks;
  const int64_t head_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadDim;  // one token slot

  // ldmatrix row addresses: lane 8i + r gives row r of matrix i.
  const int mat = lane / 8, mat_row = lane % 8;
  // K as B of S = Q K^T, per k16 step: matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15).
  const int k_lane_offset = ((mat / 2) * 8 + mat_row) * kStride + (mat % 2) * 8;
  // V as B of O += P V (transposed), per pair of n8 tiles: (keys 0-7 | 8-15) x (n | n + 1).
  const int v_lane_offset = ((mat % 2) * 8 + mat_row) * kStride + (mat / 2) * 8;
  // Q as A, per (m16 tile, k16 step): (rows 0-7 | 8-15) x (dims 0-7 | 8-15).
  const int q_lane_offset = ((mat % 2) * 8 + mat_row) * kStride + (mat / 2) * 8;

  for (int chunk = chunk_program; chunk < num_chunks; chunk += p.num_chunk_programs) {
    const int first_row = chunk * rows_per_chunk;                       // j0
    const int last_row = min(q_len, first_row + rows_per_chunk) - 1;   // j1 - 1
    __syncthreads();  // the previous chunk is done with every shared buffer

    // This thread's rows (r = 16 mt + g + 8 hr) and their positions in the sequence.
    int position[kMTiles][2];
    bool row_valid[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 16 * mt + g + 8 * hr;
        const int j = first_row + r / p.group;
        row_valid[mt][hr] = r / p.group < rows_per_chunk && j <= last_row;
        position[mt][hr] = seq_len - q_len + j;  // bottom-right causal
      }
    }

    // Keys any row of the chunk can see: [key_lo, key_hi); then this split's tiles.
    const int key_hi = seq_len - q_len + last_row + 1;
    const int key_lo = p.sliding_window > 0 ? max(0, seq_len - q_len + first_row - p.sliding_window + 1) : 0;
    const int tile_origin = key_lo / kTileKeys * kTileKeys;
    const int num_tiles = key_hi > key_lo ? (key_hi - tile_origin + kTileKeys - 1) / kTileKeys : 0;
    const int tiles_per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
    const int tile_begin = min(num_tiles, split * tiles_per_split);
    const int tile_end = min(num_tiles, tile_begin + tiles_per_split);

    // Each warp copies, and alone reads, its own 16 keys of every tile (K and V rows), so
    // the tiles flow through each warp's pipeline without block-wide barriers. Lane l < 16
    // looks up key l's cache slot (-1: past the sequence or a block outside the cache,
    // zero-filled and masked) one step before the tile's copies are issued, so the table
    // read's latency hides behind a step of work.
    auto lookup_slot = [&](int tile) -> int {
      const int pos = tile_origin + tile * kTileKeys + kWarpKeys * warp + lane;
      int slot = -1;
      if (lane < kWarpKeys && tile < tile_end && pos < seq_len) {  // pos / block_size < max_blocks
        const int block_index = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
        const int block = table_row[block_index];
        if (block >= 0 && block < p.num_blocks) slot = block * p.block_size + (pos - block_index * p.block_size);
      }
      return slot;
    };
    // Issues the copies of the tile whose slots lane l < 16 holds into `stage`; the copies
    // take each key's offset by shuffles. Returns the tile's 16-bit mask of readable keys.
    auto load_tile = [&](int slot, int stage) -> uint32_t {
      const uint32_t ok_mask = __ballot_sync(0xffffffffu, slot >= 0) & 0xffffu;
      const int64_t offset = static_cast<int64_t>(max(slot, 0)) * head_stride + static_cast<int64_t>(h) * kHeadDim;
      const uint32_t offset_lo = static_cast<uint32_t>(offset), offset_hi = static_cast<uint32_t>(offset >> 32);
      const int row0 = stage * kTileKeys + kWarpKeys * warp, vec = lane % kVecPerRow;
#pragma unroll
      for (int c = 0; c < kCopies; ++c) {
        const int key = c * kKeysPerCopy + lane / kVecPerRow;
        const uint64_t key_offset = (static_cast<uint64_t>(__shfl_sync(0xffffffffu, offset_hi, key)) << 32 |
                                     __shfl_sync(0xffffffffu, offset_lo, key)) + vec * 8;
        const bool ok = (ok_mask >> key) & 1u;
        cp_async_16(k_smem + (row0 + key) * kStride + vec * 8, p.key_cache + key_offset, ok);
        cp_async_16(v_smem + (row0 + key) * kStride + vec * 8, p.value_cache + key_offset, ok);
      }
      return ok_mask;
    };

    float acc[kMTiles][kNTiles][4];
    float run_max[kMTiles][2], run_sum[kMTiles][2];  // run_sum: this thread's columns only
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        run_max[mt][hr] = -INFINITY;
        run_sum[mt][hr] = 0.f;
      }
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
    }

    // The first kAttentionStages - 1 tiles in flight; ok_ring keeps the 16-bit masks of
    // the tiles in flight, the oldest in the low bits.
    uint64_t ok_ring = 0;
    int next_slot = lookup_slot(tile_begin);  // the slots of the next tile to copy
#pragma unroll
    for (int s = 0; s < kAttentionStages - 1; ++s) {
      if (tile_begin + s < tile_end) {
        ok_ring |= static_cast<uint64_t>(load_tile(next_slot, s)) << (16 * s);
        next_slot = lookup_slot(tile_begin + s + 1);
      }
      cp_async_commit();
    }
    // The query tile, read while the first tiles' copies are in flight: row r = (query row
    // first_row + r / group, head h * group + r % group).
    for (int i = tid; i < kRows * kVecPerRow; i += kAttentionThreads) {
      const int r = i / kVecPerRow, vec = i % kVecPerRow;
      const int j = first_row + r / p.group;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r / p.group < rows_per_chunk && j <= last_row) {
        const int64_t row = static_cast<int64_t>(start + j) * p.num_heads + h * p.group + r % p.group;
        v = *reinterpret_cast<const uint4*>(p.query + row * kHeadDim + vec * 8);
      }
      *reinterpret_cast<uint4*>(q_smem + r * kStride + vec * 8) = v;
    }
    __syncthreads();  // the query tile is in shared memory
    uint32_t q_frag[kQueryRegs ? kMTiles : 1][kQueryRegs ? kKSteps : 1][4];
    if constexpr (kQueryRegs) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          ldmatrix_x4<false>(q_frag[mt][kk], q_smem + 16 * mt * kStride + 16 * kk + q_lane_offset);
        }
    }

    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int step = tile - tile_begin;
      const int stage = step % kAttentionStages;
      const int ahead = tile + kAttentionStages - 1;
      if (ahead < tile_end) {  // into the stage the warp finished with last step
        ok_ring |= static_cast<uint64_t>(load_tile(next_slot, (step + kAttentionStages - 1) % kAttentionStages))
                   << (16 * (kAttentionStages - 1));
        next_slot = lookup_slot(ahead + 1);
      }
      cp_async_commit();
      cp_async_wait<kAttentionStages - 1>();  // this thread's copies of `tile` have landed
      __syncwarp();                           // ... and the whole warp's
      const uint32_t key_ok = static_cast<uint32_t>(ok_ring) & 0xffffu;
      ok_ring >>= 16;

      // S = Q K^T for this warp's 16 keys: s[mt][nt] covers keys 8 nt .. 8 nt + 7, summed
      // over the head dim in two independent chains (even and odd k16 steps) at one m16
      // tile, where the chain's latency would otherwise set the pace.
      constexpr int kChains = kMTiles == 1 ? 2 : 1;
      const uint16_t* k_warp = k_smem + (stage * kTileKeys + kWarpKeys * warp) * kStride;
      float s[kMTiles][2][4], s_odd[kChains == 2 ? 2 : 1][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
      for (int nt = 0; nt < (kChains == 2 ? 2 : 1); ++nt) {
        s_odd[nt][0] = s_odd[nt][1] = s_odd[nt][2] = s_odd[nt][3] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t kb[4];  // {keys 0-7: dims 0-7, 8-15}, {keys 8-15: dims 0-7, 8-15}
        ldmatrix_x4<false>(kb, k_warp + 16 * kk + k_lane_offset);
        const uint32_t kb0[2] = {kb[0], kb[1]}, kb1[2] = {kb[2], kb[3]};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          uint32_t qa[4];
          if constexpr (kQueryRegs) {
            qa[0] = q_frag[mt][kk][0], qa[1] = q_frag[mt][kk][1], qa[2] = q_frag[mt][kk][2], qa[3] = q_frag[mt][kk][3];
          } else {
            ldmatrix_x4<false>(qa, q_smem + 16 * mt * kStride + 16 * kk + q_lane_offset);
          }
          if (kChains == 2 && kk % 2 == 1) {
            mma_m16n8k16<Element>(s_odd[0], qa, kb0);
            mma_m16n8k16<Element>(s_odd[kChains - 1], qa, kb1);
          } else {
            mma_m16n8k16<Element>(s[mt][0], qa, kb0);
            mma_m16n8k16<Element>(s[mt][1], qa, kb1);
          }
        }
      }
      if constexpr (kChains == 2) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[0][nt][e] += s_odd[nt][e];
      }

      // Mask, scale (and cap) to base-2 logits, then the online softmax per row.
      const int key0 = tile_origin + tile * kTileKeys + kWarpKeys * warp;
      uint32_t pa[kMTiles][4];  // probabilities as A fragments over this warp's 16 keys
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float tile_max = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = 8 * nt + 2 * t + e;
              const int pos = key0 + key;
              const int me = position[mt][hr];
              bool visible = row_valid[mt][hr] && ((key_ok >> key) & 1u) != 0 && pos <= me;
              float x = s[mt][nt][2 * hr + e] * p.scale;
              if constexpr (kCapOrWindow) {
                if (p.sliding_window > 0) visible = visible && pos > me - p.sliding_window;
                if (p.soft_cap > 0.f) x = p.soft_cap * tanhf(x / p.soft_cap);
              }
              x = visible ? x * kLog2e : -INFINITY;
              s[mt][nt][2 * hr + e] = x;
              tile_max = fmaxf(tile_max, x);
            }
          }
          // The four lanes of a quad hold one row's 16 keys.
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          const float new_max = fmaxf(run_max[mt][hr], tile_max);
          const float base = new_max == -INFINITY ? 0.f : new_max;  // no -inf - -inf
          const float alpha = exp2f(run_max[mt][hr] - base);
          run_max[mt][hr] = new_max;
          float tile_sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const float p0 = exp2f(s[mt][nt][2 * hr] - base), p1 = exp2f(s[mt][nt][2 * hr + 1] - base);
            tile_sum += p0 + p1;
            pa[mt][2 * nt + hr] = Element::pack(p0, p1);  // a[0]/a[1]: keys 2t; a[2]/a[3]: keys 8 + 2t
          }
          run_sum[mt][hr] = run_sum[mt][hr] * alpha + tile_sum;
          // Once the row maxima settle, alpha is 1 on every lane: skip the rescale.
          if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
              acc[mt][n][2 * hr] *= alpha;
              acc[mt][n][2 * hr + 1] *= alpha;
            }
          }
        }
      }

      // O += P V, two n8 tiles of the head dim per transposed ldmatrix.
      const uint16_t* v_warp = v_smem + (stage * kTileKeys + kWarpKeys * warp) * kStride;
#pragma unroll
      for (int n = 0; n < kNTiles; n += 2) {
        uint32_t vb[4];  // {tile n: keys 0-7, 8-15}, {tile n + 1: keys 0-7, 8-15}
        ldmatrix_x4<true>(vb, v_warp + 8 * n + v_lane_offset);
        const uint32_t vb0[2] = {vb[0], vb[1]}, vb1[2] = {vb[2], vb[3]};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16<Element>(acc[mt][n], pa[mt], vb0);
          mma_m16n8k16<Element>(acc[mt][n + 1], pa[mt], vb1);
        }
      }
      __syncwarp();  // the warp is done with `stage` before its next copy into it
    }
    cp_async_wait<0>();
    __syncthreads();  // every copy has landed and every warp left the stages (o_smem reuses them)

    // Merge the four warps: publish each warp's row max and sum, then rescale and add.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float sum = run_sum[mt][hr];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0) {
          const int r = 16 * mt + g + 8 * hr;
          warp_max[warp * kRows + r] = run_max[mt][hr];
          warp_sum[warp * kRows + r] = sum;
        }
      }
    }
    __syncthreads();
    if (tid < kRows) {
      float m = -INFINITY;
      for (int w = 0; w < kAttentionWarps; ++w) m = fmaxf(m, warp_max[w * kRows + tid]);
      float l = 0.f;
      if (m != -INFINITY) {
        for (int w = 0; w < kAttentionWarps; ++w) l += exp2f(warp_max[w * kRows + tid] - m) * warp_sum[w * kRows + tid];
      }
      row_max[tid] = m;
      row_sum[tid] = l;
    }
    __syncthreads();
    float factor[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float m = row_max[16 * mt + g + 8 * hr];
        factor[mt][hr] = m == -INFINITY ? 0.f : exp2f(run_max[mt][hr] - m);
      }
    for (int w = 0; w < kAttentionWarps; ++w) {
      if (warp == w) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            float* o_row = o_smem + (16 * mt + g + 8 * hr) * Smem::kOutStride + 2 * t;
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
              const float x0 = factor[mt][hr] * acc[mt][n][2 * hr], x1 = factor[mt][hr] * acc[mt][n][2 * hr + 1];
              o_row[8 * n] = w == 0 ? x0 : o_row[8 * n] + x0;
              o_row[8 * n + 1] = w == 0 ? x1 : o_row[8 * n + 1] + x1;
            }
          }
      }
      __syncthreads();
    }

    // Write the chunk's valid rows: 8 elements (one 16-byte store of out) per step.
    for (int i = tid; i < kRows * kVecPerRow; i += kAttentionThreads) {
      const int r = i / kVecPerRow, vec = i % kVecPerRow;
      const int j = first_row + r / p.group;
      if (r / p.group >= rows_per_chunk || j > last_row) continue;
      const int64_t row = static_cast<int64_t>(start + j) * p.num_heads + h * p.group + r % p.group;
      const float l = row_sum[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;  // no visible key: zeros, LSE -inf
      const float* o_row = o_smem + r * Smem::kOutStride + vec * 8;
      const float lse = l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
      if (p.num_splits == 1) {
        uint32_t packed[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          packed[e] = pack_pair(Element::from_float(o_row[2 * e] * inv), Element::from_float(o_row[2 * e + 1] * inv));
        }
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + row * kHeadDim + vec * 8) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
        if (vec == 0 && p.lse != nullptr) p.lse[row] = lse;
      } else {
        const int64_t split_row = static_cast<int64_t>(split) * p.num_query_tokens * p.num_heads + row;
        float* dst = p.partial_out + split_row * kHeadDim + vec * 8;
        *reinterpret_cast<float4*>(dst) = make_float4(o_row[0] * inv, o_row[1] * inv, o_row[2] * inv, o_row[3] * inv);
        *reinterpret_cast<float4*>(dst + 4) =
            make_float4(o_row[4] * inv, o_row[5] * inv, o_row[6] * inv, o_row[7] * inv);
        if (vec == 0) p.partial_lse[split_row] = lse;
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // This program's rows are stored: the merge (a programmatic dependent launch with several
  // splits; otherwise a no-op) may be placed; it still waits for the whole grid to end.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace specops
