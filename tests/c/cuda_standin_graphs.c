/* CUDA graphs: captured from a stream and built node by node, made graphs in gpushared and
 * launched as one unit; parameters updated after instantiation (a launch queued before an
 * update keeps the old ones); nodes turned off; child graphs; misuse refused as CUDA refuses
 * it. Every result is read back. */
#include <stdlib.h>
#include <string.h>

#include "cuda_standin.h"

enum { N = 1024, BYTES = N * 4 };

static const char image[] = "gpushare-sim-module 1\nkernel spin\n";

/* Whether all N words at `d` are `want`. */
static int all_are(CUdeviceptr d, unsigned want) {
    static unsigned host[N];
    if (cuMemcpyDtoH(host, d, BYTES) != CUDA_SUCCESS) return 0;
    for (int i = 0; i < N; i++)
        if (host[i] != want) {
            printf("word %d is %u, not %u\n", i, host[i], want);
            return 0;
        }
    return 1;
}

/* A host function that counts its calls and notes what `a` held then (a page-locked copy). */
struct host_note {
    int calls;
    unsigned *seen; /* page-locked: the stream copied a word of `a` here before */
    unsigned last;
};

static void CUDA_CB note_call(void *p) {
    struct host_note *n = p;
    n->calls++;
    n->last = n->seen[0];
}

static CUDA_MEMSET_NODE_PARAMS memset_params(CUdeviceptr dst, unsigned value) {
    CUDA_MEMSET_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.dst = dst;
    p.value = value;
    p.elementSize = 4;
    p.width = N;
    p.height = 1;
    return p;
}

static CUDA_MEMCPY3D copy_params(CUdeviceptr dst, CUdeviceptr src) {
    CUDA_MEMCPY3D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = src;
    p.dstDevice = dst;
    p.WidthInBytes = BYTES;
    p.Height = p.Depth = 1;
    return p;
}

/* set a to `value`, copy a to b, then a kernel: built node by node. */
static CUgraph built(CUdeviceptr a, CUdeviceptr b, unsigned value, CUfunction spin,
                     unsigned long long *micros, CUgraphNode out[3]) {
    CUgraph g = NULL;
    OK(cuGraphCreate(&g, 0));
    CUDA_MEMSET_NODE_PARAMS set = memset_params(a, value);
    CUDA_MEMCPY3D copy = copy_params(b, a);
    void *args[] = {micros};
    CUDA_KERNEL_NODE_PARAMS k;
    memset(&k, 0, sizeof k);
    k.func = spin;
    k.gridDimX = k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = 32;
    k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = args;
    OK(cuGraphAddMemsetNode(&out[0], g, NULL, 0, &set, primary));
    OK(cuGraphAddMemcpyNode(&out[1], g, &out[0], 1, &copy, primary));
    OK(cuGraphAddKernelNode(&out[2], g, &out[1], 1, &k));
    return g;
}

void check_graphs(void) {
    section_begin("graphs");
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream s = NULL;
    CUdeviceptr a = 0, b = 0, c = 0;
    unsigned long long micros = 10;
    void *args[] = {&micros};
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuMemAlloc(&a, BYTES));
    OK(cuMemAlloc(&b, BYTES));
    OK(cuMemAlloc(&c, BYTES));
    if (failures) return;

    /* Captured: a memset, a copy and a kernel, launched twice. */
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuMemsetD32Async(a, 7, N, s));
    OK(cuMemcpyDtoDAsync(b, a, BYTES, s));
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    OK(cuStreamEndCapture(s, &g));
    size_t count = 0;
    OK(cuGraphGetNodes(g, NULL, &count));
    CHECK(count == 3, "the captured graph has %zu nodes, not 3", count);
    /* Its shape, as XLA checks a traced command buffer: one root, a chain of two edges. */
    CUgraphNode chain[3] = {0}, from[3] = {0}, to[3] = {0}, root[2] = {0};
    OK(cuGraphGetNodes(g, chain, &count));
    count = 0;
    OK(cuGraphGetRootNodes(g, NULL, &count));
    CHECK(count == 1, "the captured chain has %zu roots, not 1", count);
    count = 2;
    OK(cuGraphGetRootNodes(g, root, &count));
    CHECK(count == 1 && root[0] == chain[0] && root[1] == NULL, "its root is its first node");
    count = 0;
    OK(cuGraphGetEdges(g, NULL, NULL, NULL, &count));
    CHECK(count == 2, "the captured chain has %zu edges, not 2", count);
    count = 3;
    OK(cuGraphGetEdges(g, from, to, NULL, &count));
    CHECK(count == 2 && from[0] == chain[0] && to[0] == chain[1] && from[1] == chain[1] &&
              to[1] == chain[2] && from[2] == NULL && to[2] == NULL,
          "its edges run first to second to third");
    count = 3;
    OK(cuGraphNodeGetDependentNodes(chain[1], to, NULL, &count));
    CHECK(count == 1 && to[0] == chain[2], "the second node's dependent is the third");
    OK(cuGraphInstantiateWithFlags(&x, g, 0));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 7), "the captured graph ran");
    OK(cuMemsetD32(a, 0, N));
    OK(cuMemsetD32(b, 0, N));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 7), "and again");
    OK(cuGraphExecDestroy(x));
    OK(cuGraphDestroy(g));

    /* Built node by node. */
    CUgraphNode nodes[3];
    g = built(a, b, 3, spin, &micros, nodes);
    int type = -1;
    OK(cuGraphNodeGetType(nodes[1], &type));
    CHECK(type == CU_GRAPH_NODE_TYPE_MEMCPY, "a copy node's type is %d", type);
    CUgraphNode deps[4] = {0};
    count = 4;
    OK(cuGraphNodeGetDependencies(nodes[2], deps, NULL, &count));
    CHECK(count == 1 && deps[0] == nodes[1], "the kernel node depends on the copy (%zu)", count);
    OK(cuGraphInstantiateWithFlags(&x, g, 0));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 3), "the built graph ran");

    /* A launch queued before an update keeps the old parameters. */
    CUDA_MEMSET_NODE_PARAMS nine = memset_params(a, 9);
    OK(cuGraphLaunch(x, s));
    OK(cuMemcpyDtoDAsync(c, b, BYTES, s));
    OK(cuGraphExecMemsetNodeSetParams(x, nodes[0], &nine, primary));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(c, 3), "the launch before the update set 3");
    CHECK(all_are(b, 9), "the launch after it set 9");

    /* The same shape with other parameters updates; another shape is refused. */
    CUgraphNode other[3];
    CUgraph same = built(a, b, 11, spin, &micros, other);
    CUgraphExecUpdateResultInfo info;
    OK(cuGraphExecUpdate(x, same, &info));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 11), "the updated graph set 11");
    CUgraphNode extra = NULL;
    OK(cuGraphAddEmptyNode(&extra, same, &other[2], 1));
    EXPECT(cuGraphExecUpdate(x, same, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    CHECK(info.result != 0, "the update's result says why");

    /* A node turned off does nothing. */
    OK(cuMemsetD32(a, 5, N));
    OK(cuGraphNodeSetEnabled(x, nodes[0], 0));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 5), "the memset node was off: the copy took 5");
    OK(cuGraphNodeSetEnabled(x, nodes[0], 1));
    OK(cuGraphExecDestroy(x));

    /* A child graph, after a node of the parent; a capture into the parent after it. */
    CUgraph parent = NULL;
    CUgraphNode first = NULL, child = NULL;
    OK(cuGraphCreate(&parent, 0));
    CUDA_MEMSET_NODE_PARAMS zero_c = memset_params(c, 0);
    OK(cuGraphAddMemsetNode(&first, parent, NULL, 0, &zero_c, primary));
    OK(cuGraphAddChildGraphNode(&child, parent, &first, 1, g));
    OK(cuStreamBeginCaptureToGraph(s, parent, &child, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuMemcpyDtoDAsync(c, b, BYTES, s));
    CUgraph captured = NULL;
    OK(cuStreamEndCapture(s, &captured));
    CHECK(captured == parent, "a capture into a graph ends with that graph");
    OK(cuGraphInstantiateWithFlags(&x, parent, 0));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(c, 3), "the child graph set 3 and the captured copy took it");
    /* The child node takes another graph of its shape's parameters; not one of another. */
    CUgraphNode again[3];
    CUgraph thirteen = built(a, b, 13, spin, &micros, again);
    OK(cuGraphExecChildGraphNodeSetParams(x, child, thirteen));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(c, 13), "the child node's new graph set 13");
    EXPECT(cuGraphExecChildGraphNodeSetParams(x, child, same), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphExecChildGraphNodeSetParams(x, first, thirteen), CUDA_ERROR_INVALID_VALUE);
    OK(cuGraphDestroy(thirteen));
    OK(cuGraphExecDestroy(x));

    /* Host functions: captured and added node by node; such a graph is replayed, each
     * function called in its place. */
    struct host_note note = {0, NULL, 0};
    void *seen = NULL;
    OK(cuMemHostAlloc(&seen, 4096, 0));
    note.seen = seen;
    CUgraph hosted = NULL;
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuMemsetD32Async(a, 41, N, s));
    OK(cuMemcpyDtoHAsync(seen, a, 4, s));
    OK(cuLaunchHostFunc(s, note_call, &note));
    OK(cuStreamEndCapture(s, &hosted));
    CUgraphNode tail = NULL, host = NULL;
    count = 4;
    CUgraphNode captured_nodes[4];
    OK(cuGraphGetNodes(hosted, captured_nodes, &count));
    CHECK(count == 3, "the host function is a node (%zu nodes)", count);
    tail = captured_nodes[count - 1];
    CUDA_HOST_NODE_PARAMS hp = {note_call, &note};
    OK(cuGraphAddHostNode(&host, hosted, &tail, 1, &hp));
    OK(cuGraphInstantiateWithFlags(&x, hosted, 0));
    OK(cuGraphLaunch(x, s));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(note.calls == 4 && note.last == 41, "host nodes: %d calls, saw %u", note.calls,
          note.last);
    OK(cuGraphExecDestroy(x));
    OK(cuGraphDestroy(hosted));
    OK(cuMemFreeHost(seen));

    /* Misuse: a dependency from another graph, a count past the array's end (refused at its
     * first entry that is no node), a cycle. */
    CUgraphNode stray = NULL, ended[2] = {nodes[0], NULL};
    EXPECT(cuGraphAddEmptyNode(&stray, same, &nodes[0], 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphAddEmptyNode(&stray, g, ended, (size_t)-1), CUDA_ERROR_INVALID_VALUE);
    OK(cuGraphAddDependencies(g, &nodes[2], &nodes[0], NULL, 1));
    EXPECT(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_ERROR_INVALID_VALUE);

    /* A graph whose memory was freed: its launch fails, as the same copy would. */
    CUgraphNode lone[3];
    CUdeviceptr gone = 0;
    OK(cuMemAlloc(&gone, BYTES));
    CUgraph doomed = built(gone, b, 1, spin, &micros, lone);
    OK(cuGraphInstantiateWithFlags(&x, doomed, 0));
    OK(cuMemFree(gone));
    CUresult launched = cuGraphLaunch(x, s);
    CUresult synced = cuStreamSynchronize(s);
    CHECK(launched != CUDA_SUCCESS || synced != CUDA_SUCCESS,
          "a graph writing freed memory was run (%s, %s)", error_name(launched),
          error_name(synced));
    OK(cuGraphExecDestroy(x));

    OK(cuGraphDestroy(doomed));
    OK(cuGraphDestroy(parent));
    OK(cuGraphDestroy(same));
    OK(cuGraphDestroy(g));
    OK(cuMemFree(a));
    OK(cuMemFree(b));
    OK(cuMemFree(c));
    OK(cuStreamDestroy(s));
    OK(cuModuleUnload(module));
    section_end();
}

/* A graph instantiated before another program's fault, launched after it (the worker that
 * took over made it again from what gpushared kept) and updated there. */
void run_graph_holding(void) {
    section_begin("graph holding");
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream s = NULL;
    CUdeviceptr a = 0, b = 0;
    unsigned long long micros = 10;
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuMemAlloc(&a, BYTES));
    OK(cuMemAlloc(&b, BYTES));
    if (failures) return;
    CUgraphNode nodes[3];
    CUgraph g = built(a, b, 21, spin, &micros, nodes);
    CUgraphExec x = NULL;
    OK(cuGraphInstantiateWithFlags(&x, g, 0));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 21), "the graph ran before the fault");
    OK(cuMemsetD32(b, 0, N));
    OK(cuCtxSynchronize(NULL)); /* nothing of this program's is on the GPU at the fault */
    go_ahead("holding");
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 21), "the graph ran after the fault");
    CUDA_MEMSET_NODE_PARAMS other = memset_params(a, 22);
    OK(cuGraphExecMemsetNodeSetParams(x, nodes[0], &other, primary));
    OK(cuGraphLaunch(x, s));
    OK(cuStreamSynchronize(s));
    CHECK(all_are(b, 22), "and updated");
    OK(cuGraphExecDestroy(x));
    OK(cuGraphDestroy(g));
    OK(cuMemFree(a));
    OK(cuMemFree(b));
    OK(cuStreamDestroy(s));
    OK(cuModuleUnload(module));
    section_end();
}

/* A graph of one kernel that occupies the sim device for `micros`, launched `count` times
 * (the scheduler grants each launch as one unit, as it grants a kernel). */
void run_graph_spin(unsigned long count, unsigned long long micros, unsigned blocks) {
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream s = NULL;
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    void *args[] = {&micros};
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuLaunchKernel(spin, blocks, 1, 1, 32, 1, 1, 0, s, args, NULL));
    OK(cuStreamEndCapture(s, &g));
    OK(cuGraphInstantiateWithFlags(&x, g, 0));
    if (failures) return;
    for (unsigned long i = 0; i < count; i++) {
        CUresult r = cuGraphLaunch(x, s);
        if (r != CUDA_SUCCESS) {
            CHECK(0, "graph launch %lu gave %s", i, error_name(r));
            return;
        }
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
    OK(cuStreamSynchronize(s));
    OK(cuGraphExecDestroy(x));
    OK(cuGraphDestroy(g));
    OK(cuStreamDestroy(s));
    OK(cuModuleUnload(module));
    printf("spun %lu\n", count);
}
