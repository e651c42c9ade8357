//! Names of NVIDIA ioctl commands, for people reading telemetry.
//!
//! Two families reach the device files:
//! - Resource-manager ("RM") escapes on `/dev/nvidiactl` and `/dev/nvidiaN`: Linux-style
//!   numbers `_IOWR('F', nr, params)`. The driver dispatches on `nr` alone (the size field only
//!   sizes the copy), so the name comes from `nr`. From NVIDIA's open kernel modules:
//!   `src/nvidia/arch/nvalloc/unix/include/nv_escape.h` (0x27–0x5e) and
//!   `kernel-open/common/inc/nv-ioctl-numbers.h` (`NV_IOCTL_BASE` 200 + n).
//! - UVM on `/dev/nvidia-uvm`: plain numbers (`UVM_IOCTL_BASE(i)` is `i` on Linux), from
//!   `kernel-open/nvidia-uvm/uvm_ioctl.h` and `uvm_linux_ioctl.h`.
//!
//! Anything else prints as hex (`0xc0104600`).

/// ioctl type of NVIDIA's RM escapes.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

/// `nr` → name for RM escapes.
const RM: &[(u32, &str)] = &[
    (0x27, "RM_ALLOC_MEMORY"),
    (0x28, "RM_ALLOC_OBJECT"),
    (0x29, "RM_FREE"),
    (0x2a, "RM_CONTROL"),
    (0x2b, "RM_ALLOC"),
    (0x32, "RM_CONFIG_GET"),
    (0x33, "RM_CONFIG_SET"),
    (0x34, "RM_DUP_OBJECT"),
    (0x35, "RM_SHARE"),
    (0x37, "RM_CONFIG_GET_EX"),
    (0x38, "RM_CONFIG_SET_EX"),
    (0x39, "RM_I2C_ACCESS"),
    (0x41, "RM_IDLE_CHANNELS"),
    (0x4a, "RM_VID_HEAP_CONTROL"),
    (0x4d, "RM_ACCESS_REGISTRY"),
    (0x4e, "RM_MAP_MEMORY"),
    (0x4f, "RM_UNMAP_MEMORY"),
    (0x52, "RM_GET_EVENT_DATA"),
    (0x54, "RM_ALLOC_CONTEXT_DMA2"),
    (0x56, "RM_ADD_VBLANK_CALLBACK"),
    (0x57, "RM_MAP_MEMORY_DMA"),
    (0x58, "RM_UNMAP_MEMORY_DMA"),
    (0x59, "RM_BIND_CONTEXT_DMA"),
    (0x5c, "RM_EXPORT_OBJECT_TO_FD"),
    (0x5d, "RM_IMPORT_OBJECT_FROM_FD"),
    (0x5e, "RM_UPDATE_DEVICE_MAPPING_INFO"),
    // NV_IOCTL_BASE (200) + n.
    (200, "CARD_INFO"),
    (201, "REGISTER_FD"),
    (206, "ALLOC_OS_EVENT"),
    (207, "FREE_OS_EVENT"),
    (209, "STATUS_CODE"),
    (210, "CHECK_VERSION_STR"),
    (211, "IOCTL_XFER_CMD"),
    (212, "ATTACH_GPUS_TO_FD"),
    (213, "QUERY_DEVICE_INTR"),
    (214, "SYS_PARAMS"),
    (215, "NUMA_INFO"),
    (216, "SET_NUMA_STATUS"),
    (217, "EXPORT_TO_DMABUF_FD"),
    (218, "WAIT_OPEN_COMPLETE"),
];

/// Command → name for UVM.
const UVM: &[(u32, &str)] = &[
    (1, "UVM_RESERVE_VA"),
    (2, "UVM_RELEASE_VA"),
    (3, "UVM_REGION_COMMIT"),
    (4, "UVM_REGION_DECOMMIT"),
    (5, "UVM_REGION_SET_STREAM"),
    (6, "UVM_SET_STREAM_RUNNING"),
    (7, "UVM_SET_STREAM_STOPPED"),
    (9, "UVM_RUN_TEST"),
    (10, "UVM_ADD_SESSION"),
    (11, "UVM_REMOVE_SESSION"),
    (12, "UVM_ENABLE_COUNTERS"),
    (13, "UVM_MAP_COUNTER"),
    (14, "UVM_CREATE_EVENT_QUEUE"),
    (15, "UVM_REMOVE_EVENT_QUEUE"),
    (16, "UVM_MAP_EVENT_QUEUE"),
    (17, "UVM_EVENT_CTRL"),
    (18, "UVM_REGISTER_MPS_SERVER"),
    (19, "UVM_REGISTER_MPS_CLIENT"),
    (20, "UVM_GET_GPU_UUID_TABLE"),
    (23, "UVM_CREATE_RANGE_GROUP"),
    (24, "UVM_DESTROY_RANGE_GROUP"),
    (25, "UVM_REGISTER_GPU_VASPACE"),
    (26, "UVM_UNREGISTER_GPU_VASPACE"),
    (27, "UVM_REGISTER_CHANNEL"),
    (28, "UVM_UNREGISTER_CHANNEL"),
    (29, "UVM_ENABLE_PEER_ACCESS"),
    (30, "UVM_DISABLE_PEER_ACCESS"),
    (31, "UVM_SET_RANGE_GROUP"),
    (33, "UVM_MAP_EXTERNAL_ALLOCATION"),
    (34, "UVM_FREE"),
    (35, "UVM_MEM_MAP"),
    (36, "UVM_DEBUG_ACCESS_MEMORY"),
    (37, "UVM_REGISTER_GPU"),
    (38, "UVM_UNREGISTER_GPU"),
    (39, "UVM_PAGEABLE_MEM_ACCESS"),
    (40, "UVM_PREVENT_MIGRATION_RANGE_GROUPS"),
    (41, "UVM_ALLOW_MIGRATION_RANGE_GROUPS"),
    (42, "UVM_SET_PREFERRED_LOCATION"),
    (43, "UVM_UNSET_PREFERRED_LOCATION"),
    (44, "UVM_ENABLE_READ_DUPLICATION"),
    (45, "UVM_DISABLE_READ_DUPLICATION"),
    (46, "UVM_SET_ACCESSED_BY"),
    (47, "UVM_UNSET_ACCESSED_BY"),
    (51, "UVM_MIGRATE"),
    (53, "UVM_MIGRATE_RANGE_GROUP"),
    (54, "UVM_ENABLE_SYSTEM_WIDE_ATOMICS"),
    (55, "UVM_DISABLE_SYSTEM_WIDE_ATOMICS"),
    (56, "UVM_TOOLS_INIT_EVENT_TRACKER"),
    (57, "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD"),
    (58, "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS"),
    (59, "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS"),
    (60, "UVM_TOOLS_ENABLE_COUNTERS"),
    (61, "UVM_TOOLS_DISABLE_COUNTERS"),
    (62, "UVM_TOOLS_READ_PROCESS_MEMORY"),
    (63, "UVM_TOOLS_WRITE_PROCESS_MEMORY"),
    (64, "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE"),
    (65, "UVM_MAP_DYNAMIC_PARALLELISM_REGION"),
    (66, "UVM_UNMAP_EXTERNAL"),
    (67, "UVM_TOOLS_FLUSH_EVENTS"),
    (68, "UVM_ALLOC_SEMAPHORE_POOL"),
    (69, "UVM_CLEAN_UP_ZOMBIE_RESOURCES"),
    (70, "UVM_PAGEABLE_MEM_ACCESS_ON_GPU"),
    (71, "UVM_POPULATE_PAGEABLE"),
    (72, "UVM_VALIDATE_VA_RANGE"),
    (73, "UVM_CREATE_EXTERNAL_RANGE"),
    (74, "UVM_MAP_EXTERNAL_SPARSE"),
    (75, "UVM_MM_INITIALIZE"),
    (2047, "UVM_IS_8_SUPPORTED"),
    (0x3000_0001, "UVM_INITIALIZE"),
    (0x3000_0002, "UVM_DEINITIALIZE"),
];

/// `_IOC_TYPE(cmd)`.
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}

/// `_IOC_NR(cmd)`.
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// The readable name of an ioctl command: `RM_CONTROL`, `UVM_FREE`, or `0x…` when unknown.
pub fn command_name(cmd: u32) -> String {
    known_name(cmd).map_or_else(|| format!("{cmd:#x}"), str::to_owned)
}

/// The name of a command this table knows.
pub fn known_name(cmd: u32) -> Option<&'static str> {
    let lookup =
        |table: &[(u32, &'static str)], key| table.iter().find(|(k, _)| *k == key).map(|e| e.1);
    if ioc_type(cmd) == NV_IOCTL_MAGIC {
        lookup(RM, ioc_nr(cmd))
    } else if cmd >> 8 == 0 || cmd >> 28 == 3 || cmd == 2047 {
        // UVM numbers: small integers, plus the two 0x3000000x lifecycle commands.
        lookup(UVM, cmd)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_commands_pytorch_makes() {
        // Commands a PyTorch inference run makes.
        assert_eq!(command_name(0xc020_462a), "RM_CONTROL");
        assert_eq!(command_name(0xc030_462b), "RM_ALLOC");
        assert_eq!(command_name(0xc038_464e), "RM_MAP_MEMORY");
        assert_eq!(command_name(0x21), "UVM_MAP_EXTERNAL_ALLOCATION");
        assert_eq!(command_name(0x49), "UVM_CREATE_EXTERNAL_RANGE");
        assert_eq!(command_name(0x3000_0001), "UVM_INITIALIZE");
    }

    #[test]
    fn rm_names_ignore_the_size_field() {
        assert_eq!(command_name(0xc048_46d2), "CHECK_VERSION_STR");
        assert_eq!(command_name(0xc900_46c8), "CARD_INFO");
        assert_eq!(command_name(0x0000_4629), "RM_FREE");
    }

    #[test]
    fn unknown_commands_print_as_hex() {
        assert_eq!(command_name(0x5401), "0x5401"); // TCGETS
        assert_eq!(command_name(0xc010_4600), "0xc0104600");
        assert_eq!(command_name(0x3000_0003), "0x30000003");
    }

    #[test]
    fn tables_have_no_duplicates() {
        for table in [RM, UVM] {
            let mut keys: Vec<u32> = table.iter().map(|e| e.0).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), table.len());
        }
    }
}
