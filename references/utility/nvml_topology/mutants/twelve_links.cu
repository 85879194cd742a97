// NVLink topology through NVML: how many NVLinks join this rank's GPU to each rank's GPU.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if __has_include(<nvml.h>)
#include <nvml.h>
#else
// The part of <nvml.h> this task needs (NVML's C ABI), for build machines without the header.
// The solution is linked against libnvidia-ml.
extern "C" {
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;
typedef enum nvmlEnableState_enum {
  NVML_FEATURE_DISABLED = 0,
  NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;
typedef enum nvmlIntNvLinkDeviceType_enum {
  NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
  NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
  NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
  NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
} nvmlIntNvLinkDeviceType_t;
typedef enum nvmlNvLinkCapability_enum {
  NVML_NVLINK_CAP_P2P_SUPPORTED = 0,
  NVML_NVLINK_CAP_SYSMEM_ACCESS = 1,
  NVML_NVLINK_CAP_P2P_ATOMICS = 2,
  NVML_NVLINK_CAP_SYSMEM_ATOMICS = 3,
  NVML_NVLINK_CAP_SLI_BRIDGE = 4,
  NVML_NVLINK_CAP_VALID = 5,
  NVML_NVLINK_CAP_COUNT
} nvmlNvLinkCapability_t;
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];  // "dddd:bb:dd.f"
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];  // "dddddddd:bb:dd.f"
} nvmlPciInfo_t;
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci);
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t* isActive);
nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                           nvmlNvLinkCapability_t capability,
                                           unsigned int* capResult);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t* pci);
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t* pNvLinkDeviceType);
}
#define nvmlInit nvmlInit_v2
#define nvmlDeviceGetCount nvmlDeviceGetCount_v2
#define nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2
#define nvmlDeviceGetHandleByPciBusId nvmlDeviceGetHandleByPciBusId_v2
#define nvmlDeviceGetPciInfo nvmlDeviceGetPciInfo_v3
#define nvmlDeviceGetNvLinkRemotePciInfo nvmlDeviceGetNvLinkRemotePciInfo_v2
#endif

#include "commbench.h"

// >>> COMMBENCH EDIT discovery
// mutant: probes a hard-coded 12 links (an A100 has 12; H100, H200 and B300 have 18)
// The links are found once, on the first call (the topology does not change while the job
// runs); every call then writes the cached row with one tiny kernel.
//
// For every active NVLink of this rank's GPU, NVML says what is at the far end: a GPU (and its
// PCI address) or an NVSwitch. The ranks exchange their GPUs' PCI addresses with
// ctx->allgather, so a direct link counts for the rank whose GPU sits at its far end. Links to
// NVSwitches join this GPU to every GPU of the switch fabric: through the switches two GPUs
// are joined by min(switch links of one, switch links of the other) links (18 on HGX
// H100/H200 boards, as `nvidia-smi topo -m` counts them).
struct PciAddr {
  unsigned domain, bus, device, function;
};

static bool same_addr(const PciAddr& a, const PciAddr& b) {
  return a.domain == b.domain && a.bus == b.bus && a.device == b.device &&
         a.function == b.function;
}

// "dddd:bb:dd.f" (CUDA) and "dddddddd:bb:dd.f" (NVML) alike: compared as numbers, never as text
static bool parse_bus_id(const char* s, PciAddr* a) {
  unsigned d = 0, b = 0, v = 0, f = 0;
  if (sscanf(s, "%x:%x:%x.%x", &d, &b, &v, &f) != 4) return false;
  *a = PciAddr{d, b, v, f};
  return true;
}

struct Row {
  long long v[COMMBENCH_MAX_RANKS];
};

__global__ void write_row(Row row, long long* out, int n) {
  const int i = threadIdx.x;
  if (i < n) out[i] = row.v[i];
}

struct Hello {  // what each rank tells the others
  int ok;
  int switch_links;  // active links of its GPU whose far end is an NVSwitch
  PciAddr addr;      // its GPU's PCI address
};

static void report(const char* what, nvmlReturn_t rc) {
  fprintf(stderr, "nvml_topology: %s failed: %s\n", what, nvmlErrorString(rc));
}

// Fills row->v[0 .. world) for this rank; 0 on success. Collective: every rank calls it at the
// same time and takes part in every exchange even when its own NVML calls failed, so one
// rank's failure never leaves the others waiting.
static int discover(const commbench_ctx* ctx, Row* row) {
  const int world = ctx->world_size;
  Hello me{};
  me.ok = 1;
  nvmlDevice_t dev{};
  char bus_id[64] = {0};
  nvmlReturn_t rc = nvmlInit_v2();
  if (rc != NVML_SUCCESS) {
    report("nvmlInit_v2", rc);
    me.ok = 0;
  }
  if (me.ok && cudaDeviceGetPCIBusId(bus_id, (int)sizeof bus_id, ctx->device) != cudaSuccess) {
    fprintf(stderr, "nvml_topology: cudaDeviceGetPCIBusId failed\n");
    me.ok = 0;
  }
  if (me.ok && (rc = nvmlDeviceGetHandleByPciBusId_v2(bus_id, &dev)) != NVML_SUCCESS) {
    report("nvmlDeviceGetHandleByPciBusId_v2", rc);
    me.ok = 0;
  }
  if (me.ok && !parse_bus_id(bus_id, &me.addr)) me.ok = 0;
  Hello all[COMMBENCH_MAX_RANKS];
  if (ctx->allgather(ctx->host, &me, sizeof me, all) != 0) return 1;
  for (int r = 0; r < world; ++r)
    if (!all[r].ok) return 1;  // every rank sees the same and gives up together

  int direct[COMMBENCH_MAX_RANKS] = {0};
  const unsigned kMaxLinks = 12;  // NVLinks per GPU (A100)
  for (unsigned l = 0; l < kMaxLinks; ++l) {
    nvmlEnableState_t active = NVML_FEATURE_DISABLED;
    if (nvmlDeviceGetNvLinkState(dev, l, &active) != NVML_SUCCESS ||
        active != NVML_FEATURE_ENABLED)
      continue;  // no such link, or down
    nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    if (nvmlDeviceGetNvLinkRemoteDeviceType(dev, l, &type) != NVML_SUCCESS)
      type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
      ++me.switch_links;
      continue;
    }
    nvmlPciInfo_t remote;
    memset(&remote, 0, sizeof remote);
    PciAddr far{};
    if (nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, l, &remote) != NVML_SUCCESS ||
        !parse_bus_id(remote.busId, &far)) {
      // a far end this host cannot name: an NVSwitch outside the VM (NCCL assumes the same)
      if (type == NVML_NVLINK_DEVICE_TYPE_UNKNOWN) ++me.switch_links;
      continue;
    }
    int peer = -1;
    for (int r = 0; r < world; ++r)
      if (r != ctx->rank && same_addr(all[r].addr, far)) peer = r;
    if (peer >= 0) {
      ++direct[peer];
      continue;
    }
    if (type == NVML_NVLINK_DEVICE_TYPE_UNKNOWN) {  // the GPU of no rank, or a switch?
      nvmlDevice_t other;
      if (nvmlDeviceGetHandleByPciBusId_v2(remote.busId, &other) != NVML_SUCCESS)
        ++me.switch_links;
    }
  }
  if (ctx->allgather(ctx->host, &me, sizeof me, all) != 0) return 1;
  for (int r = 0; r < world; ++r) {
    long long n = 0;
    if (r != ctx->rank) {
      const int via_switch = me.switch_links < all[r].switch_links ? me.switch_links
                                                                   : all[r].switch_links;
      n = direct[r] + via_switch;
    }
    row->v[r] = n;
  }
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  int64_t* links = (int64_t*)ctx->buffers[0];  // output: links[r] for r = 0 .. world_size-1
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  static Row row;
  static int known = 0;  // the world size the row was found for (0: not yet)
  const int world = ctx->world_size;
  if (world > COMMBENCH_MAX_RANKS || ctx->buffer_bytes[0] < world * sizeof(int64_t)) return 2;
  if (known != world) {
    if (discover(ctx, &row) != 0) return 1;
    known = world;
  }
  write_row<<<1, 32, 0, stream>>>(row, (long long*)links, world);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
