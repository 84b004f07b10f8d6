//! `MemoryService`: authenticate, then the write front (surfaces/writes.rs).

use engram_proto::memory_service_server::MemoryService;
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, DeleteRequest, DeleteResponse, GetRequest, GetResponse,
    UpsertRequest, UpsertResponse,
};
use tonic::{Request, Response, Status};

use crate::gateway::Gateway;
use crate::surfaces::writes;

#[derive(Clone)]
pub struct Memory(pub Gateway);

#[tonic::async_trait]
impl MemoryService for Memory {
    async fn upsert(
        &self,
        request: Request<UpsertRequest>,
    ) -> Result<Response<UpsertResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let r = writes::upsert(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let r = writes::delete(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let r = writes::get(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }

    async fn add_edges(
        &self,
        request: Request<AddEdgesRequest>,
    ) -> Result<Response<AddEdgesResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let r = writes::add_edges(&self.0, identity, request.into_inner()).await?;
        Ok(Response::new(r))
    }
}
