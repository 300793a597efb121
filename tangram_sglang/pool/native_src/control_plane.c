/* The control plane's per-page loops, for tangram_sglang/pool/native.py (ctypes).
 *
 * Each function does what a numpy reference in the package does (named above it), on the same
 * arrays, in one pass: numpy needs a dozen passes over B x V x pages for the same work. All arrays
 * are C-contiguous; page ids, counts and lengths int32 unless noted, indices int64. Callers check
 * dtypes and shapes (native.py); the functions check every bound they write through and change
 * nothing when one fails.
 */
#include <stdint.h>

/* Pages a draw prefetches ahead. The free stack's order is the order pages were last released in, so a
 * draw's page ids land at scattered places of the refcount and fill arrays (megabytes at 80 layers x 8
 * groups): each write would wait on a cache miss. 32 ahead cut a cold draw's time by about a quarter
 * on the development host (16: an eighth; 64: no better). */
#define DRAW_AHEAD 32

/* x % page_size == 0, with a mask when the page size is a power of two (a division costs ~30 cycles) */
static inline int at_boundary(int32_t x, int32_t page_size)
{
    return (page_size & (page_size - 1)) == 0 ? (x & (page_size - 1)) == 0 : x % page_size == 0;
}

/* chunk_draw.draw_chunks' draw (PagePool.take + the arena append): pop need[b, v] pages per (b, v),
 * in (b, v) order, off the top of the free stack; each gets refcount 1 and fill P and is appended to
 * arena row (slots[b], v) after its npages. Returns the new number of free pages, -1 when the stack
 * holds fewer pages than asked, -2 when a row would pass the arena's capacity. */
int64_t tg_draw(int32_t *free_stack, int64_t num_free, int32_t *refcount, int32_t *fill, int32_t page_size,
                int32_t *arena_pages, int32_t *arena_npages, int64_t V, int64_t cap,
                const int64_t *slots, int64_t B, const int64_t *need)
{
    int64_t total = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
            int64_t n = need[b * V + v];
            if (n < 0 || arena_npages[slots[b] * V + v] + n > cap) return -2;
            total += n;
        }
    if (total > num_free) return -1;
    int64_t top = num_free;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = slots[b];
        for (int64_t v = 0; v < V; v++) {
            int64_t n = need[b * V + v];
            int32_t *row = arena_pages + (s * V + v) * cap + arena_npages[s * V + v];
            for (int64_t k = 0; k < n; k++) {
                if (top > DRAW_AHEAD) {
                    int32_t ahead = free_stack[top - 1 - DRAW_AHEAD];
                    __builtin_prefetch(&refcount[ahead], 1);
                    __builtin_prefetch(&fill[ahead], 1);
                }
                int32_t id = free_stack[--top];
                refcount[id] = 1;
                fill[id] = page_size;
                row[k] = id;
            }
            arena_npages[s * V + v] += (int32_t)n;
        }
    }
    return top;
}

/* chunk_draw.chunk_pages: out[b, v, k] (int32 [B, V, W]) = the k-th page the run of counts[b, v] slots
 * from slot lens[b, v] falls in (arena row (slots[b], v), column lens // P + k), -1 past the run.
 * Returns 0, or -2 when a run needs more than W columns or reads past the arena's capacity. */
int64_t tg_chunk_pages(const int32_t *arena_pages, int64_t V, int64_t cap, const int64_t *slots, int64_t B,
                       const int32_t *lens, const int64_t *counts, int32_t page_size, int64_t W, int32_t *out)
{
    for (int64_t i = 0; i < B * V; i++) {
        int64_t c = counts[i], off = lens[i] % page_size, first = lens[i] / page_size;
        int64_t ncols = c > 0 ? (off + c + page_size - 1) / page_size : 0;
        if (ncols > W || first + ncols > cap) return -2;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
            int64_t i = b * V + v, c = counts[i];
            int64_t off = lens[i] % page_size, first = lens[i] / page_size;
            int64_t ncols = c > 0 ? (off + c + page_size - 1) / page_size : 0;
            const int32_t *row = arena_pages + (slots[b] * V + v) * cap + first;
            int32_t *dst = out + i * W;
            for (int64_t k = 0; k < W; k++) dst[k] = k < ncols ? row[k] : -1;
        }
    return 0;
}

/* block_table.chunk_slots_reference: the flat slot page * P + offset of every kept slot, in (layer, b,
 * g, j) order, into out (int64 [sum(counts)]). pages int32 [B, L, G, W], offset / counts int64
 * [B, L, G]: slot j of (b, l, g) is in page pages[b, l, g, (offset + j) // P] at (offset + j) % P.
 * Returns the slots written, or -2 when a run needs more than W pages. */
int64_t tg_chunk_slots(const int32_t *pages, const int64_t *offset, const int64_t *counts,
                       int64_t B, int64_t L, int64_t G, int64_t W, int32_t page_size, int64_t *out)
{
    for (int64_t i = 0; i < B * L * G; i++)
        if (counts[i] > 0 && (offset[i] + counts[i] + page_size - 1) / page_size > W) return -2;
    int64_t o = 0;
    for (int64_t l = 0; l < L; l++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < G; g++) {
                int64_t i = (b * L + l) * G + g, left = counts[i], start = offset[i];
                const int32_t *run = pages + i * W;
                for (int64_t k = 0; left > 0; k++) {
                    int64_t m = page_size - start < left ? page_size - start : left;
                    int64_t base = (int64_t)run[k] * page_size + start;
                    for (int64_t t = 0; t < m; t++) out[o++] = base + t;
                    left -= m;
                    start = 0;
                }
            }
    return o;
}

/* DeviceBlockTables._new_columns and the flat index extend writes through: for kept row k (arena slot
 * slots[k], table row rows[k]) and virtual layer v = l * G + g, the columns [first[k, v], npages[k, v])
 * of the arena row: at = ((l * R + rows[k]) * G + g) * W + col into a table [L, R, G, W], val the page
 * id (0 for a released column). at int64, val int32, both [sum(npages - first)] in (k, v, col) order;
 * or, with table (int32 [L, R, G, W] in host memory) not NULL, table[at] = val written in place and at,
 * val untouched; there, columns [npages, zero_to) are zeroed too (a row loaded whole, as
 * DeviceBlockTables.load leaves it). Returns the entries, or -2 when a column passes the arena's capacity
 * or the table's W. */
int64_t tg_new_columns(const int32_t *arena_pages, int64_t V, int64_t cap, const int64_t *slots,
                       const int64_t *rows, int64_t K, const int64_t *first, const int32_t *npages,
                       int64_t G, int64_t R, int64_t W, int64_t *at, int32_t *val, int32_t *table, int64_t zero_to)
{
    if (zero_to > W) return -2;
    for (int64_t i = 0; i < K * V; i++)
        if (npages[i] > cap || npages[i] > W || rows[i / V] < 0 || rows[i / V] >= R) return -2;
    int64_t o = 0;
    for (int64_t k = 0; k < K; k++)
        for (int64_t v = 0; v < V; v++) {
            int64_t l = v / G, g = v % G, i = k * V + v;
            const int32_t *row = arena_pages + (slots[k] * V + v) * cap;
            int64_t base = ((l * R + rows[k]) * G + g) * W;
            if (v + 1 < V) {   /* the next row's first columns: rows lie kilobytes apart, so each is a miss */
                int64_t l2 = (v + 1) / G, g2 = (v + 1) % G, at2 = ((l2 * R + rows[k]) * G + g2) * W + first[i + 1];
                __builtin_prefetch(&row[cap + first[i + 1]], 0);
                if (table != 0) {
                    __builtin_prefetch(&table[at2], 1);
                    __builtin_prefetch(&table[at2 + 16], 1);
                }
            }
            if (table != 0) {
                for (int64_t col = first[i]; col < npages[i]; col++) table[base + col] = row[col] > 0 ? row[col] : 0;
                for (int64_t col = npages[i]; col < zero_to; col++) table[base + col] = 0;
                o += npages[i] > first[i] ? npages[i] - first[i] : 0;
                continue;
            }
            for (int64_t col = first[i]; col < npages[i]; col++) {
                at[o] = base + col;
                val[o++] = row[col] > 0 ? row[col] : 0;
            }
        }
    return o;
}

/* RaggedKVCache.reserve_decode_step's search: the flat indices s * V + v (s = slots[b]) of the (b, v)
 * whose slot count is at a page boundary (the next decode step opens a page there) and whose
 * reservation is used up, in (b, v) order, into need_at (int64 [B * V]). Returns how many. */
int64_t tg_step_need(const int32_t *lens, const int32_t *reserved_left, int64_t V, const int64_t *slots,
                     int64_t B, int32_t page_size, int64_t *need_at)
{
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
            int64_t at = slots[b] * V + v;
            if (at_boundary(lens[at], page_size) && reserved_left[at] == 0) need_at[n++] = at;
        }
    return n;
}

/* RaggedKVCache.decode_step's page work (no window layers): each (b, v) whose slot count lens is at
 * a page boundary, in (b, v) order, takes a page off the free stack (refcount 1, fill P), from its
 * reservation where reserved_left > 0, and appends it; then every (b, v) gains a slot. opened (int64
 * [B * V, 3]) receives (b, v, page id) per page opened; out[0] the pages taken from reservations,
 * out[1] the largest slot count after the step. Returns the new number of free pages; -1 when the pages
 * beyond reservations exceed `available`, -2 when a row would pass the arena's capacity (then nothing
 * changed). */
int64_t tg_decode(int32_t *free_stack, int64_t num_free, int64_t available, int32_t *refcount, int32_t *fill,
                  int32_t page_size, int32_t *pages, int32_t *npages, int32_t *lens, int32_t *taken,
                  int32_t *reserved_left, int64_t V, int64_t cap, const int64_t *slots, int64_t B,
                  int64_t *opened, int64_t *out)
{
    int64_t n = 0, n_res = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
            int64_t at = slots[b] * V + v;
            if (!at_boundary(lens[at], page_size)) continue;
            if (npages[at] >= cap) return -2;
            /* the column this step appends to: rows lie cap * 4 bytes apart (megabytes at long contexts), so
             * each is a miss; asked for here, it is in cache when the second pass writes it */
            __builtin_prefetch(&pages[at * cap + npages[at]], 1);
            n++;
            n_res += reserved_left[at] > 0;
        }
    if (n - n_res > available || n > num_free) return -1;
    for (int64_t k = 1; k <= n; k++) {   /* the pages the step takes: their refcount and fill lines too */
        __builtin_prefetch(&refcount[free_stack[num_free - k]], 1);
        __builtin_prefetch(&fill[free_stack[num_free - k]], 1);
    }
    int64_t top = num_free, o = 0;
    int32_t longest = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
            int64_t at = slots[b] * V + v;
            if (at_boundary(lens[at], page_size)) {
                int32_t id = free_stack[--top];
                refcount[id] = 1;
                fill[id] = page_size;
                pages[at * cap + npages[at]] = id;
                npages[at] += 1;
                taken[at] += 1;
                if (reserved_left[at] > 0) reserved_left[at] -= 1;
                opened[3 * o] = b;
                opened[3 * o + 1] = v;
                opened[3 * o + 2] = id;
                o++;
            }
            lens[at] += 1;
            if (lens[at] > longest) longest = lens[at];
        }
    out[0] = n_res;
    out[1] = longest;
    return top;
}

/* PagePool.decref(RequestPages.held()) for one request's arena row slot: drop one reference on each live
 * page of its lists (columns [0, npages) of every v, -1 skipped), in (v, column) order; a page reaching 0
 * goes back on the free stack (fill 0). The columns become -1 (PageArena.free_slot's clearing). Returns
 * the new number of free pages, or -3 when a page has no reference to drop (a double free: nothing
 * changed). */
int64_t tg_release(int32_t *free_stack, int64_t num_free, int32_t *refcount, int32_t *fill,
                   int32_t *arena_pages, const int32_t *arena_npages, int64_t V, int64_t cap, int64_t slot)
{
    for (int64_t v = 0; v < V; v++) {
        const int32_t *row = arena_pages + (slot * V + v) * cap;
        for (int64_t c = 0; c < arena_npages[slot * V + v]; c++)
            if (row[c] >= 0 && refcount[row[c]] <= 0) return -3;
    }
    int64_t top = num_free;
    for (int64_t v = 0; v < V; v++) {
        int32_t *row = arena_pages + (slot * V + v) * cap;
        for (int64_t c = 0; c < arena_npages[slot * V + v]; c++) {
            int32_t id = row[c];
            if (id >= 0 && --refcount[id] == 0) {
                free_stack[top++] = id;
                fill[id] = 0;
            }
            row[c] = -1;
        }
    }
    return top;
}
