// The CUDA paged-attention kernel: tensor-core tiles over a paged KV cache, with the query
// rows of one sequence and the GQA group of one KV head in a single tile, so each KV head's
// keys and values are read once however many query rows (decode 1, verify k + 1) share them.
//
// Grid: one program per (sequence b, KV head h, chunk program c, KV split s), flattened.
// A program walks the row chunks c, c + C, c + 2C, ... of sequence b (a chunk = kRows tile
// rows = R query rows x group heads, R = kRows / group), and for each chunk the key tiles of
// split s of the chunk's visible key range, kTileKeys keys per tile, double-buffered in
// shared memory by cp.async (zero-filled where a key is missing). Four warps share a tile,
// each taking 16 of its keys for every row (S = Q K^T and O += P V with mma.m16n8k16,
// online softmax in base 2), and merge their partial results through shared memory at the
// end of the chunk. With one split the program writes out (and lse); with several it writes
// a float32 partial output and its natural-log LSE, merged by merge_splits_kernel.
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
  int max_blocks;               // columns of block_table
  int batch;                    // B
  int num_chunk_programs;       // C
  int num_splits;               // S
};

constexpr int kAttentionWarps = 4;
constexpr int kAttentionThreads = 32 * kAttentionWarps;
constexpr int kTileKeys = 16 * kAttentionWarps;  // 16 keys per warp
constexpr int kAttentionStages = 2;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory layout of one program (bytes). 16-bit rows are padded by 8 elements (16
// bytes) and float rows by 8 floats so the fragment loads and stores hit distinct banks.
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
  static constexpr int kOut = kValues + kAttentionStages * kTileBytes;
  static constexpr int kWarpMax = kOut + kRows * kOutStride * 4;      // [warps, rows] float
  static constexpr int kWarpSum = kWarpMax + kAttentionWarps * kRows * 4;
  static constexpr int kRowMax = kWarpSum + kAttentionWarps * kRows * 4;  // [rows] float
  static constexpr int kRowSum = kRowMax + kRows * 4;
  static constexpr int kKeyOk = kRowSum + kRows * 4;                   // [stages, keys] int
  static constexpr int kBytes = kKeyOk + kAttentionStages * kTileKeys * 4;
  static_assert(kKeys % 16 == 0 && kValues % 16 == 0 && kOut % 16 == 0, "16-byte aligned regions");
};

template <typename Element, int kHeadDim, int kMTiles>
__global__ void __launch_bounds__(kAttentionThreads)
    paged_attention_kernel(const PagedAttentionParams p) {
  using Smem = AttentionSmem<kHeadDim, kMTiles>;
  constexpr int kRows = Smem::kRows;
  constexpr int kStride = Smem::kStride;
  constexpr int kVecPerRow = kHeadDim / 8;  // 16-byte vectors per row
  constexpr int kNTiles = kHeadDim / 8;     // n8 tiles of the output
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem + Smem::kQuery);
  uint16_t* k_smem = reinterpret_cast<uint16_t*>(smem + Smem::kKeys);
  uint16_t* v_smem = reinterpret_cast<uint16_t*>(smem + Smem::kValues);
  float* o_smem = reinterpret_cast<float*>(smem + Smem::kOut);
  float* warp_max = reinterpret_cast<float*>(smem + Smem::kWarpMax);
  float* warp_sum = reinterpret_cast<float*>(smem + Smem::kWarpSum);
  float* row_max = reinterpret_cast<float*>(smem + Smem::kRowMax);
  float* row_sum = reinterpret_cast<float*>(smem + Smem::kRowSum);
  int* key_ok = reinterpret_cast<int*>(smem + Smem::kKeyOk);

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

  for (int chunk = chunk_program; chunk < num_chunks; chunk += p.num_chunk_programs) {
    const int first_row = chunk * rows_per_chunk;                       // j0
    const int last_row = min(q_len, first_row + rows_per_chunk) - 1;   // j1 - 1
    __syncthreads();  // the previous chunk is done with every shared buffer

    // Query tile: row r = (query row first_row + r / group, head h * group + r % group).
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

    // Loads tile `tile` (keys tile_origin + tile * kTileKeys ...) into stage `stage`.
    auto load_tile = [&](int tile, int stage) {
      const int key0 = tile_origin + tile * kTileKeys;
      uint16_t* k_dst = k_smem + stage * kTileKeys * kStride;
      uint16_t* v_dst = v_smem + stage * kTileKeys * kStride;
      for (int i = tid; i < kTileKeys * kVecPerRow; i += kAttentionThreads) {
        const int key = i / kVecPerRow, vec = i % kVecPerRow;
        const int pos = key0 + key;
        int block = -1;
        if (pos < seq_len) {  // pos / block_size < max_blocks since seq_len is clamped
          block = table_row[pos / p.block_size];
          if (block >= p.num_blocks) block = -1;
        }
        const bool ok = block >= 0;
        const int64_t slot = ok ? static_cast<int64_t>(block) * p.block_size + pos % p.block_size : 0;
        const int64_t offset = slot * head_stride + static_cast<int64_t>(h) * kHeadDim + vec * 8;
        cp_async_16(k_dst + key * kStride + vec * 8, p.key_cache + offset, ok);
        cp_async_16(v_dst + key * kStride + vec * 8, p.value_cache + offset, ok);
        if (vec == 0) key_ok[stage * kTileKeys + key] = ok;
      }
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

    if (tile_begin < tile_end) {
      load_tile(tile_begin, 0);
      cp_async_commit();
    }
    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int stage = (tile - tile_begin) % kAttentionStages;
      if (tile + 1 < tile_end) load_tile(tile + 1, stage ^ 1);  // stage ^ 1 was freed last iteration
      cp_async_commit();
      cp_async_wait<1>();  // this thread's copies of `tile` have landed
      __syncthreads();     // ... and everyone's, the query tile too

      // S = Q K^T for this warp's 16 keys: s[mt][nt] covers keys 8 nt .. 8 nt + 7.
      const uint16_t* k_warp = k_smem + (stage * kTileKeys + 16 * warp) * kStride;
      float s[kMTiles][2][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t kb[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint16_t* key_row = k_warp + (8 * nt + g) * kStride + 16 * kk + 2 * t;
          kb[nt][0] = load_pair(key_row);
          kb[nt][1] = load_pair(key_row + 8);
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const uint16_t* q_row = q_smem + (16 * mt + g) * kStride + 16 * kk + 2 * t;
          const uint32_t qa[4] = {load_pair(q_row), load_pair(q_row + 8 * kStride), load_pair(q_row + 8),
                                  load_pair(q_row + 8 * kStride + 8)};
          mma_m16n8k16<Element>(s[mt][0], qa, kb[0]);
          mma_m16n8k16<Element>(s[mt][1], qa, kb[1]);
        }
      }

      // Mask, scale (and cap) to base-2 logits, then the online softmax per row.
      const int key0 = tile_origin + tile * kTileKeys + 16 * warp;
      const int* ok_warp = key_ok + stage * kTileKeys + 16 * warp;
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
              bool visible = row_valid[mt][hr] && ok_warp[key] != 0 && pos <= me;
              if (p.sliding_window > 0) visible = visible && pos > me - p.sliding_window;
              float x = s[mt][nt][2 * hr + e] * p.scale;
              if (p.soft_cap > 0.f) x = p.soft_cap * tanhf(x / p.soft_cap);
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
#pragma unroll
          for (int n = 0; n < kNTiles; ++n) {
            acc[mt][n][2 * hr] *= alpha;
            acc[mt][n][2 * hr + 1] *= alpha;
          }
        }
      }

      // O += P V: B fragment (k = key 2t, 2t + 1 | 2t + 8, 2t + 9; n = head dim 8 n + g).
      const uint16_t* v_warp = v_smem + (stage * kTileKeys + 16 * warp) * kStride;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int d = 8 * n + g;
        const uint32_t vb[2] = {pack_pair(v_warp[(2 * t) * kStride + d], v_warp[(2 * t + 1) * kStride + d]),
                                pack_pair(v_warp[(2 * t + 8) * kStride + d], v_warp[(2 * t + 9) * kStride + d])};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma_m16n8k16<Element>(acc[mt][n], pa[mt], vb);
      }
      __syncthreads();  // every warp is done with `stage` before it is loaded again
    }
    cp_async_wait<0>();

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
}

}  // namespace specops
