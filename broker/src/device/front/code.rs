//! What the device runs for clients, kept to make again after a fault: modules, their
//! functions (with the attributes set on them) and graphs, each a handle with its recipe.

use std::sync::Arc;

use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::graph::{GraphChange, encode_changes};

use super::Device;
use crate::device::call::Call;
use crate::device::handles::{Function, Graph, Held, Module, Recipe};
use crate::device::{DeviceError, DeviceResult, Reply};

impl Device {
    // ---- modules ---------------------------------------------------------------------

    /// Loads a module; its image is kept for as long as the module lives, to load it again
    /// in the context that takes over after a fault.
    pub fn load_module(&self, format: ModuleFormat, image: Arc<[u8]>) -> DeviceResult<Module> {
        let (epoch, id) = (self.epoch(), self.name());
        let call = Call::LoadModule { id, format };
        self.call(call.clone(), &image)?.done()?;
        self.link.mirror(id, &call, &image);
        self.owner.recipes.add(id, Recipe::Module { format, image });
        Ok(Module(Held::new(&self.owner, epoch, id, |module| {
            Call::DropModule { module }
        })))
    }

    pub fn get_function(&self, module: &Module, name: &str) -> DeviceResult<Function> {
        let epoch = module.0.epoch;
        let (module, id) = (self.id(module)?, self.name());
        let call = Call::GetFunction { id, module };
        self.call(call.clone(), name.as_bytes())?.done()?;
        self.link.mirror(id, &call, &Arc::from(name.as_bytes()));
        let recipe = Recipe::Function {
            module,
            name: name.to_string(),
            attributes: Vec::new(),
        };
        self.owner.recipes.add(id, recipe);
        Ok(Function(Held::new(&self.owner, epoch, id, |function| {
            Call::DropFunction { function }
        })))
    }

    /// `cuFuncSetAttribute`, kept to set again after a fault.
    pub fn set_function_attribute(
        &self,
        function: &Function,
        attribute: u32,
        value: i32,
    ) -> DeviceResult<()> {
        let id = self.id(function)?;
        let call = Call::SetFunctionAttribute {
            function: id,
            attribute,
            value,
        };
        self.call(call.clone(), &[])?.done()?;
        self.link.mirror(id, &call, &Arc::from(&[][..]));
        self.owner.recipes.note_attribute(id, attribute, value);
        Ok(())
    }

    // ---- graphs ----------------------------------------------------------------------

    /// Makes and instantiates a graph of `nodes` (encoded, each kernel's function one of this
    /// device's handles); the nodes are kept to make it again after a fault.
    pub fn make_graph(&self, nodes: Arc<[u8]>) -> DeviceResult<Graph> {
        let (epoch, id) = (self.epoch(), self.name());
        self.call(Call::MakeGraph { id }, &nodes)?.done()?;
        self.owner.recipes.add(id, Recipe::Graph { nodes });
        Ok(Graph(Held::new(&self.owner, epoch, id, |graph| {
            Call::DropGraph { graph }
        })))
    }

    /// New parameters for some of a graph's nodes (`changes`, each kernel's function one of
    /// this device's handles), for its launches queued after this: this thread's calls reach
    /// the device in order. `nodes` is the whole graph as it is now, kept to make it again.
    pub fn update_graph(
        &self,
        graph: &Graph,
        changes: &[GraphChange],
        nodes: Arc<[u8]>,
    ) -> DeviceResult<()> {
        let id = self.id(graph)?;
        let changes =
            encode_changes(changes).map_err(|e| DeviceError::InvalidArgument(e.to_string()))?;
        let in_place = self
            .call(Call::UpdateGraph { graph: id }, &changes)
            .and_then(Reply::done);
        if in_place.is_err() {
            // The device could not change it in place: made again whole, under its name.
            self.call(Call::DropGraph { graph: id }, &[])?.done()?;
            self.call(Call::MakeGraph { id }, &nodes)?.done()?;
        }
        self.owner.recipes.add(id, Recipe::Graph { nodes });
        Ok(())
    }
}
