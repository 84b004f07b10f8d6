//! `WorkingMemoryService`: authenticate, validate, then Layer 6
//! (surfaces/working) or the demand counters (surfaces/demand.rs).

use engram_proto::working_memory_service_server::WorkingMemoryService;
use engram_proto::{GetDemandRequest, GetDemandResponse, GetMemoryRequest, GetMemoryResponse};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::gateway::Gateway;
use crate::surfaces::demand;
use crate::surfaces::working::{self, MemoryQuery};

/// The gRPC face of Layer 6.
#[derive(Clone)]
pub struct Working(pub Gateway);

#[tonic::async_trait]
impl WorkingMemoryService for Working {
    async fn get_memory(
        &self,
        request: Request<GetMemoryRequest>,
    ) -> Result<Response<GetMemoryResponse>, Status> {
        let start = Instant::now();
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let deadline = self.0.deadline(request.metadata(), start);
        let mq = MemoryQuery::try_from(request.into_inner())?;
        Ok(Response::new(
            working::get_memory(&self.0, identity, mq, start, deadline).await?,
        ))
    }

    async fn get_demand(
        &self,
        request: Request<GetDemandRequest>,
    ) -> Result<Response<GetDemandResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let GetDemandRequest { limit } = request.into_inner();
        let limit = limit.unwrap_or(demand::DEFAULT_DEMAND_LIMIT);
        if !(1..=demand::MAX_DEMAND_LIMIT).contains(&limit) {
            return Err(Error::invalid(
                "limit",
                format!("must be in 1..={}", demand::MAX_DEMAND_LIMIT),
            )
            .into());
        }
        Ok(Response::new(self.0.demand().snapshot(
            &identity.tenant,
            identity.trust,
            limit as usize,
        )))
    }
}
