//! The modules and functions a client loaded. The control task loads them (module images
//! come over the control socket); the data thread looks functions up to launch them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpushare_protocol::ErrorCode;

use super::graphs::GraphTable;
use crate::device::{Function, Module};
use crate::images::HeldImage;

/// Most modules one client may hold.
pub const MAX_MODULES: usize = 256;
/// Most function handles one client may hold.
pub const MAX_FUNCTIONS: usize = 65536;

/// Modules and functions a client loaded; shared with the control task that loads them.
#[derive(Default)]
pub struct ModuleTable {
    handles: Handles<Module, Function>,
    /// Module globals the client looked up (base → (size, module, name)): copies may name
    /// them.
    globals: BTreeMap<u64, (u64, u64, String)>,
    /// Whether a copy or memset wrote into a global: its contents are then the client's, and
    /// a module loaded again starts from its image's.
    globals_written: bool,
    /// Each module's image, kept while loaded: the broker shares image bytes between
    /// sessions by their hash for as long as one of them holds it.
    images: HashMap<u64, HeldImage>,
    /// Instantiated graphs (they hold the functions they run).
    pub graphs: GraphTable,
}

impl ModuleTable {
    pub fn insert_module(&mut self, module: Module) -> Result<u64, ErrorCode> {
        self.handles.insert_module(module)
    }

    /// Adds a module loaded from `image`, which is kept with it.
    pub fn insert_module_from(
        &mut self,
        module: Module,
        image: HeldImage,
    ) -> Result<u64, ErrorCode> {
        let id = self.handles.insert_module(module)?;
        self.images.insert(id, image);
        Ok(id)
    }

    /// Records a global of module `module` that the client may copy to and from.
    pub fn add_global(&mut self, module: u64, ptr: u64, size: u64, name: String) {
        self.globals.insert(ptr, (size, module, name));
    }

    /// Whether `[ptr, ptr + len)` lies inside one global the client looked up.
    pub fn in_global(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.globals
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &(size, _, _))| end <= base.saturating_add(size))
    }

    pub fn module(&self, id: u64) -> Option<Arc<Module>> {
        self.handles.module(id)
    }

    pub fn insert_function(&mut self, module: u64, f: Function) -> Result<u64, ErrorCode> {
        self.handles.insert_function(module, f)
    }

    pub fn function(&self, id: u64) -> Option<Arc<Function>> {
        self.handles.function(id)
    }

    /// A command writes `[ptr, ptr + len)`: note whether that is in a global.
    pub fn note_write(&mut self, ptr: u64, len: u64) {
        if !self.globals_written && self.in_global(ptr, len) {
            self.globals_written = true;
        }
    }

    /// Whether a copy or memset wrote into a global the client looked up.
    pub fn globals_written(&self) -> bool {
        self.globals_written
    }

    /// Every global the client looked up: (its address, size, module, name).
    pub fn globals(&self) -> Vec<(u64, u64, u64, String)> {
        self.globals
            .iter()
            .map(|(&base, (size, module, name))| (base, *size, *module, name.clone()))
            .collect()
    }

    /// Unloads a module and forgets its functions and globals.
    pub fn remove_module(&mut self, id: u64) -> bool {
        self.globals.retain(|_, (_, m, _)| *m != id);
        // The module first: it holds the image's bytes too, until the device lets go.
        let removed = self.handles.remove_module(id);
        self.images.remove(&id);
        removed
    }

    pub fn clear(&mut self) {
        self.graphs.clear();
        self.globals.clear();
        self.images.clear();
        self.handles.clear();
    }

    /// Forgets everything, returning the module and function ids that were live.
    pub fn take_ids(&mut self) -> (Vec<u64>, Vec<u64>) {
        self.graphs.clear();
        self.globals.clear();
        self.images.clear();
        self.handles.take_ids()
    }
}

/// The table itself, over any module and function types: a device's may not be made without
/// the device (the sim device has none), and the limits and ids are tested without one.
struct Handles<M, F> {
    modules: HashMap<u64, Arc<M>>,
    /// Function id → the module it came from, and the function.
    functions: HashMap<u64, (u64, Arc<F>)>,
    /// Module and function ids come from one counter and are never reused, so a stale
    /// handle never names something loaded later.
    next: u64,
}

impl<M, F> Default for Handles<M, F> {
    fn default() -> Self {
        Handles {
            modules: HashMap::new(),
            functions: HashMap::new(),
            next: 1,
        }
    }
}

impl<M, F> Handles<M, F> {
    fn insert_module(&mut self, module: M) -> Result<u64, ErrorCode> {
        if self.modules.len() >= MAX_MODULES {
            return Err(ErrorCode::TooManyHandles);
        }
        let id = self.next;
        self.next += 1;
        self.modules.insert(id, Arc::new(module));
        Ok(id)
    }

    fn module(&self, id: u64) -> Option<Arc<M>> {
        self.modules.get(&id).cloned()
    }

    fn insert_function(&mut self, module: u64, f: F) -> Result<u64, ErrorCode> {
        if self.functions.len() >= MAX_FUNCTIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        let id = self.next;
        self.next += 1;
        self.functions.insert(id, (module, Arc::new(f)));
        Ok(id)
    }

    fn function(&self, id: u64) -> Option<Arc<F>> {
        self.functions.get(&id).map(|(_, f)| f.clone())
    }

    fn remove_module(&mut self, id: u64) -> bool {
        self.functions.retain(|_, (m, _)| *m != id);
        self.modules.remove(&id).is_some()
    }

    fn clear(&mut self) {
        self.functions.clear();
        self.modules.clear();
    }

    fn take_ids(&mut self) -> (Vec<u64>, Vec<u64>) {
        let ids = (
            self.modules.keys().copied().collect(),
            self.functions.keys().copied().collect(),
        );
        self.clear();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Table = Handles<&'static str, &'static str>;

    #[test]
    fn modules_past_the_limit_are_refused_until_one_is_unloaded() {
        let mut t = Table::default();
        let mut first = None;
        for _ in 0..MAX_MODULES {
            let id = t.insert_module("m");
            assert!(id.is_ok());
            first = first.or(id.ok());
        }
        assert_eq!(t.insert_module("m"), Err(ErrorCode::TooManyHandles));
        assert!(t.remove_module(first.unwrap_or_default()));
        assert!(t.insert_module("m").is_ok());
    }

    #[test]
    fn functions_past_the_limit_are_refused() {
        let mut t = Table::default();
        let Ok(m) = t.insert_module("m") else {
            panic!("the first module is refused");
        };
        for _ in 0..MAX_FUNCTIONS {
            assert!(t.insert_function(m, "f").is_ok());
        }
        assert_eq!(t.insert_function(m, "f"), Err(ErrorCode::TooManyHandles));
        // Unloading the module frees its functions' places.
        assert!(t.remove_module(m));
        assert!(t.insert_function(m, "f").is_ok());
    }

    #[test]
    fn unloading_a_module_forgets_its_functions_only() {
        let mut t = Table::default();
        let (Ok(a), Ok(b)) = (t.insert_module("a"), t.insert_module("b")) else {
            panic!("modules refused");
        };
        let (Ok(fa), Ok(fb)) = (t.insert_function(a, "fa"), t.insert_function(b, "fb")) else {
            panic!("functions refused");
        };
        assert!(t.remove_module(a));
        assert!(t.module(a).is_none());
        assert!(t.function(fa).is_none());
        assert_eq!(t.module(b).as_deref(), Some(&"b"));
        assert_eq!(t.function(fb).as_deref(), Some(&"fb"));
        assert!(!t.remove_module(a), "a module unloads once");
    }

    #[test]
    fn a_stale_handle_never_names_something_loaded_later() {
        let mut t = Table::default();
        let Ok(old) = t.insert_module("old") else {
            panic!("module refused");
        };
        let Ok(old_f) = t.insert_function(old, "old f") else {
            panic!("function refused");
        };
        t.remove_module(old);
        let (Ok(new), Ok(new_f)) = (t.insert_module("new"), t.insert_function(old, "new f")) else {
            panic!("refused");
        };
        assert!(![old, old_f].contains(&new) && ![old, old_f].contains(&new_f));
        assert!(t.module(old).is_none());
        assert!(t.function(old_f).is_none());
    }

    #[test]
    fn take_ids_lists_what_was_live_and_empties_the_table() {
        let mut t = Table::default();
        let (Ok(m), Ok(gone)) = (t.insert_module("m"), t.insert_module("gone")) else {
            panic!("modules refused");
        };
        let Ok(f) = t.insert_function(m, "f") else {
            panic!("function refused");
        };
        t.remove_module(gone);
        assert_eq!(t.take_ids(), (vec![m], vec![f]));
        assert!(t.module(m).is_none() && t.function(f).is_none());
        assert_eq!(t.take_ids(), (vec![], vec![]));
    }
}
