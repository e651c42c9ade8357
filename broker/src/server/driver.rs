//! Control requests only consolidated clients (a client-side CUDA driver) make: modules by
//! content hash, functions with their layout and attributes, a module's function names,
//! module globals, page-locked host memory shared for DMA, and tensor maps.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{
    BrokerMessage, ClientMessage, FunctionDetails, HostRegionGrant, ImageHash, ModuleFormat,
    TensorMapArgs,
};
use gpushare_protocol::error::WireError;

use super::Broker;
use super::control::SessionScope;
use crate::device::{Call, Device, DeviceError, DeviceResult, Module, Reply};
use crate::session::{ModuleTable, SessionInfo};
use crate::shm::HostRegion;

fn wire(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

/// A device error as the client is told it.
pub(super) fn told(e: DeviceError) -> WireError {
    wire(e.code(), e.to_string())
}

/// Runs device work off the control plane's threads (a call may wait for the device).
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> DeviceResult<T> + Send + 'static,
) -> Result<DeviceResult<T>, WireError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| wire(ErrorCode::Internal, e.to_string()))
}

/// Runs a device call that the device answers at once (a lookup, a tensor map: nothing to
/// load, map or build) on this thread, the runtime's other tasks handed to another
/// (`block_in_place`), instead of on a blocking thread and back: a control request then took
/// 60-73 µs instead of 92-120 on two cores (docs/benchmarks.md, "Control requests"). It may
/// still wait for the device, as [`blocking`] does. On a runtime of one thread (unit tests)
/// it is [`blocking`].
pub(super) async fn quick<T: Send + 'static>(
    work: impl FnOnce() -> DeviceResult<T> + Send + 'static,
) -> Result<DeviceResult<T>, WireError> {
    let many = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if many {
        return Ok(tokio::task::block_in_place(work));
    }
    blocking(work).await
}

/// The session's module `module`.
pub(super) fn module_of(
    modules: &Mutex<ModuleTable>,
    module: u64,
) -> Result<Arc<Module>, WireError> {
    modules
        .lock()
        .map_err(|_| wire(ErrorCode::Internal, "module table poisoned"))?
        .module(module)
        .ok_or_else(|| wire(ErrorCode::InvalidHandle, format!("no module {module}")))
}

impl Broker {
    /// Answers one of the consolidated requests (`None` for any other message).
    pub(super) async fn consolidated_request(
        &self,
        msg: &ClientMessage,
        fds: Vec<OwnedFd>,
        scope: SessionScope<'_>,
        session: Option<&SessionInfo>,
    ) -> Option<BrokerMessage> {
        Some(match msg {
            ClientMessage::LoadCachedModule {
                request,
                format,
                hash,
            } => BrokerMessage::ModuleLoaded {
                request: *request,
                result: self.load_cached(scope, session, *format, hash).await,
            },
            ClientMessage::GetFunctionInfo {
                request,
                module,
                name,
            } => BrokerMessage::FunctionInfo {
                request: *request,
                result: Self::function_info(scope, *module, name.clone()).await,
            },
            ClientMessage::GetGlobal {
                request,
                module,
                name,
            } => BrokerMessage::Global {
                request: *request,
                result: Self::global(scope, *module, name.clone()).await,
            },
            ClientMessage::ShareHostMemory {
                request,
                bytes,
                at,
                offset,
            } => BrokerMessage::HostShared {
                request: *request,
                result: Self::share_host(scope, session, fds, *bytes, (*at, *offset)).await,
            },
            ClientMessage::UnshareHostMemory { request, region } => BrokerMessage::HostUnshared {
                request: *request,
                result: Self::unshare_host(scope, session, *region).await,
            },
            ClientMessage::EncodeTensorMap { request, args } => BrokerMessage::TensorMap {
                request: *request,
                result: Self::tensor_map(scope.1, args).await,
            },
            ClientMessage::GetFunctionNames {
                request,
                module,
                first,
            } => BrokerMessage::FunctionNames {
                request: *request,
                result: Self::function_names(scope, *module, *first).await,
            },
            ClientMessage::MakeGraph { request, bytes } => BrokerMessage::GraphMade {
                request: *request,
                result: Self::make_graph(scope, fds, *bytes).await,
            },
            _ => return None,
        })
    }

    /// A tensor map made by the device's driver, in the context that runs the client's work.
    async fn tensor_map(device: &Arc<Device>, args: &TensorMapArgs) -> Result<Vec<u8>, WireError> {
        let payload = gpushare_protocol::control::encode(args)
            .map_err(|e| wire(ErrorCode::InvalidArgument, e.to_string()))?;
        let device = device.clone();
        quick(move || {
            device
                .call(Call::EncodeTensorMap, &payload)
                .and_then(Reply::bytes)
        })
        .await?
        .map_err(told)
    }

    async fn load_cached(
        &self,
        (modules, device): SessionScope<'_>,
        session: Option<&SessionInfo>,
        format: ModuleFormat,
        hash: &ImageHash,
    ) -> Result<u64, WireError> {
        let holder = session
            .map(|s| self.holder(s))
            .ok_or_else(|| wire(ErrorCode::Internal, "a module without a session"))?;
        let image = self
            .images
            .hold_cached(hash, &holder)?
            .ok_or_else(|| wire(ErrorCode::NotFound, "no such image here; send it"))?;
        Self::load_held(modules, device, format, image).await
    }

    async fn function_info(
        scope: SessionScope<'_>,
        module: u64,
        name: String,
    ) -> Result<FunctionDetails, WireError> {
        let id = Self::get_function(scope.0, scope.1, module, name).await?;
        let f = scope
            .0
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "module table poisoned"))?
            .function(id)
            .ok_or_else(|| wire(ErrorCode::Internal, "function gone"))?;
        let device = scope.1.clone();
        let shape = quick(move || {
            let function = device.id(&*f)?;
            device.call(Call::FunctionShape { function }, &[])?.shape()
        })
        .await?
        .map_err(told)?;
        Ok(FunctionDetails {
            id,
            params: shape.params,
            attributes: shape.attributes,
        })
    }

    /// A page of the names of a module's functions, from the `first`th on, and how many it
    /// has (`cuModuleEnumerateFunctions` in the device's context).
    async fn function_names(
        (modules, device): SessionScope<'_>,
        module: u64,
        first: u32,
    ) -> Result<(u32, Vec<String>), WireError> {
        let m = module_of(modules, module)?;
        let device = device.clone();
        quick(move || {
            let module = device.id(&*m)?;
            device
                .call(Call::FunctionNames { module, first }, &[])?
                .names()
        })
        .await?
        .map_err(told)
    }

    async fn global(
        (modules, device): SessionScope<'_>,
        module: u64,
        name: String,
    ) -> Result<(u64, u64), WireError> {
        let m = module_of(modules, module)?;
        let device = device.clone();
        let asked = name.clone();
        let (ptr, size) = quick(move || {
            let module = device.id(&*m)?;
            device
                .call(Call::ModuleGlobal { module }, asked.as_bytes())?
                .pair()
        })
        .await?
        .map_err(|e| match e.code() {
            ErrorCode::DeviceError => wire(ErrorCode::NotFound, e.to_string()),
            code => wire(code, e.to_string()),
        })?;
        modules
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "module table poisoned"))?
            .add_global(module, ptr, size, name);
        Ok((ptr, size))
    }

    async fn share_host(
        (_, device): SessionScope<'_>,
        session: Option<&SessionInfo>,
        fds: Vec<OwnedFd>,
        bytes: u64,
        place: (u64, u64),
    ) -> Result<HostRegionGrant, WireError> {
        let info = session.ok_or_else(|| wire(ErrorCode::PermissionDenied, "no session"))?;
        let fd = fds.into_iter().next().ok_or_else(|| {
            wire(
                ErrorCode::InvalidArgument,
                "ShareHostMemory must carry a memfd or a tmpfs file",
            )
        })?;
        info.hosts
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "host table poisoned"))?
            .room_for(bytes)
            .map_err(|c| wire(c, "too much shared host memory for one client"))?;
        // Counted against the user's bound before anything is locked; given back if the
        // sharing fails.
        info.account()
            .pin(bytes)
            .map_err(|why| wire(why.code(), why.to_string()))?;
        let shared = Self::map_and_register(device, info, fd, bytes, place).await;
        if shared.is_err() {
            info.account().unpin(bytes);
        }
        shared
    }

    /// Maps the client's file (`bytes` at `offset`, placed at `at` in the device's process),
    /// registers it with the device and adds it to the session.
    async fn map_and_register(
        device: &Arc<Device>,
        info: &SessionInfo,
        fd: OwnedFd,
        bytes: u64,
        (at, offset): (u64, u64),
    ) -> Result<HostRegionGrant, WireError> {
        let region = Arc::new(
            // Anywhere here: the device maps it where the client has it.
            HostRegion::map_client(&fd, bytes, 0, offset)
                .map_err(|e| wire(ErrorCode::InvalidArgument, e.to_string()))?,
        );
        let device = device.clone();
        let registered = region.clone();
        let device_ptr = blocking(move || {
            use std::os::fd::AsFd;
            let id = registered.id();
            device.share_memory(id, fd.as_fd(), bytes, at, offset)?;
            let span = registered.whole().span();
            let mapped = device
                .call(Call::RegisterHost { span }, &[])
                .and_then(Reply::value);
            if mapped.is_err() {
                device.unshare_memory(id);
            }
            mapped
        })
        .await?
        .map_err(told)?;
        let id = info
            .hosts
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "host table poisoned"))?
            .insert(region, device_ptr)
            .map_err(|c| wire(c, "too much shared host memory for one client"))?;
        Ok(HostRegionGrant {
            region: id,
            device_ptr,
        })
    }

    async fn unshare_host(
        (_, device): SessionScope<'_>,
        session: Option<&SessionInfo>,
        region: u32,
    ) -> Result<(), WireError> {
        let info = session.ok_or_else(|| wire(ErrorCode::PermissionDenied, "no session"))?;
        let shared = info
            .hosts
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "host table poisoned"))?
            .remove(region)
            .ok_or_else(|| wire(ErrorCode::InvalidHandle, format!("no host region {region}")))?;
        let len = shared.region.len() as u64;
        let device = device.clone();
        // Unregistering page-locked memory takes the driver hundreds of microseconds (a JAX
        // start frees over a hundred such buffers): the runtime's other tasks go elsewhere.
        let unregistered = quick(move || {
            let span = shared.region.whole().span();
            let _ = device.call(Call::UnregisterHost { span }, &[]);
            device.unshare_memory(shared.region.id());
            Ok(())
        })
        .await;
        // The client's region is gone from its table either way: so is its pinned count.
        info.account().unpin(len);
        unregistered?.map_err(told)
    }
}
